"""The stateful step walker: a stateful engine, any runner, inputs of any length, no recomputed context.

A stateful step (rkstudy.graph.stateful) takes `emit` new frames and its state, and returns
`emit x rate` output samples and the next state. Its contract says everything the walk needs: the
walked inputs (at `emit` frames) and masks the walker makes, the constants, the state pairs (input
fed back from output), and in `params` the step size and the lookahead. The walker keeps the state
as one flat fp32 vector (the state inputs flattened, in contract order) and cuts it into the
engine's state tensors on every step.

The step lags its input by `lookahead_samples` output samples, so after the last real frame the
walker flushes with zero frames and mask 0 until the last real sample is out, and drops the first
`lookahead_samples` of the stream (they precede frame 0). With every conv input masked (by the
graph itself or by the frame mask the surgery adds, rkstudy.graph.validity), every conv input
outside the real frames is then zero, exactly the full-length decode's zero padding, so both ends
are exact and the whole stream equals one full-length pass.

Board side: numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from math import ceil

import numpy as np

from ..contract import Contract
from ..errors import EngineMismatch
from ..runtime.wrappers import ContractDtypes, Recording

WALKER_ROLES = ("walked", "mask", "constant", "state")


class StatefulWalker:
    """Feed frames in any chunking; get each output sample back exactly once, in order.

    `runner` is any Runner (fp32, simulator, board, replay: `run({name: array})` returns the outputs
    in contract order); it is checked against `contract` here. `constants` holds the constant inputs
    (a speaker embedding), fed unchanged on every step. `dtype` is float32 for every engine; float64
    only for a float64 reference interpreter, where the state must not round to fp32.
    """

    def __init__(self, runner, contract: Contract, constants: Mapping[str, np.ndarray] | None = None,
                 dtype=np.float32):
        c, fix = contract, f"; make a matching one with `{contract.remake}`"
        if c.window is not None or not c.state:
            raise EngineMismatch(f"the {c.family} contract carries no state (a window walk, not a stateful step)"
                                 + fix)
        missing = [k for k in ("emit", "lookahead_samples") if not isinstance(c.params.get(k), int)]
        if missing:
            raise EngineMismatch(f"the {c.family} contract's params have no {', '.join(missing)}" + fix)
        self.emit, self.delay = c.params["emit"], c.params["lookahead_samples"]
        # an output ends this many samples past rate x frames over a whole utterance (negative: short of it)
        self.extra = dict(c.params.get("output_extra") or {})
        odd = [t.name for t in c.inputs if t.role not in WALKER_ROLES]
        if odd:
            raise EngineMismatch(f"a stateful walker feeds walked, mask, constant and state inputs, not {odd}" + fix)
        self.walked, self.masks = c.role("walked"), c.role("mask")
        self.outputs = c.role("walked", outputs=True)
        for t in self.walked + self.masks + self.outputs:
            if t.axis != len(t.shape) - 1 or t.extra or t.frames != self.emit:
                raise EngineMismatch(f"{t.name} {t.shape} is not {self.emit} frames x {t.rate} on its last axis"
                                     + fix)
        if not self.walked or not self.outputs or len({t.rate for t in self.outputs}) != 1:
            raise EngineMismatch("a stateful step needs walked inputs and walked outputs at one rate" + fix)
        c.check_runner(runner)
        self.runner, self.contract, self.dtype = runner, c, dtype
        self.set_constants(constants or {})
        self.state_in = c.role("state")
        paired = dict(c.state)
        self.state_out = [[t.name for t in c.outputs].index(paired[s.name]) for s in self.state_in]
        self.out_index = [c.outputs.index(t) for t in self.outputs]
        self.state_floats = sum(int(np.prod(t.shape)) for t in self.state_in)
        if c.params.get("state_floats", self.state_floats) != self.state_floats:
            raise EngineMismatch(f"the contract's state tensors hold {self.state_floats} floats, its params say "
                                 f"{c.params['state_floats']}" + fix)
        self.reset()

    def set_constants(self, constants: Mapping[str, np.ndarray]) -> None:
        """The constant inputs from now on (a speaker embedding per utterance), each in its contract shape."""
        c = self.contract
        absent = [t.name for t in c.role("constant") if t.name not in constants]
        if absent:
            raise EngineMismatch(f"the {c.family} step needs {', '.join(absent)} as well")
        self.constants = {t.name: np.reshape(np.asarray(constants[t.name], self.dtype), t.shape)
                          for t in c.role("constant")}

    @property
    def hop(self) -> int:
        """Output samples per frame."""
        return self.outputs[0].rate

    @property
    def first_audio_frames(self) -> int:
        """Frames the walker must be given before it returns the first real sample: whole steps
        until the stream is past the lookahead."""
        return ceil((self.delay + 1) / (self.emit * self.hop)) * self.emit

    def reset(self) -> None:
        """Start a new utterance: zero state, i.e. the zero padding before the first frame."""
        self.state = np.zeros(self.state_floats, self.dtype)
        self._pending = {t.name: np.zeros(t.shape[1:-1] + (0,), self.dtype) for t in self.walked}
        self._to_drop = self.delay
        self.frames_in = 0
        self.steps = 0

    def _frames(self, frames) -> dict[str, np.ndarray]:
        if not isinstance(frames, Mapping):
            if len(self.walked) != 1:
                raise EngineMismatch(f"this step takes {', '.join(t.name for t in self.walked)}; pass a dict")
            frames = {self.walked[0].name: frames}
        out, counts = {}, set()
        for t in self.walked:
            x = np.asarray(frames[t.name], self.dtype)
            if x.shape[:-1] != t.shape[1:-1] or x.shape[-1] % t.rate:
                raise EngineMismatch(f"{t.name} has shape {x.shape}; this step takes {t.shape[1:-1] + ('n',)} "
                                     f"at {t.rate} per frame (batch axis dropped)")
            out[t.name] = x
            counts.add(x.shape[-1] // t.rate)
        if len(counts) != 1:
            raise EngineMismatch("every walked input must bring the same number of frames")
        return out

    def _n(self, arrays: Mapping[str, np.ndarray]) -> int:
        t = self.walked[0]
        return arrays[t.name].shape[-1] // t.rate

    def _split(self) -> dict[str, np.ndarray]:
        out, offset = {}, 0
        for t in self.state_in:
            size = int(np.prod(t.shape))
            out[t.name] = self.state[offset: offset + size].reshape(t.shape)
            offset += size
        return out

    def _run(self, frames: Mapping[str, np.ndarray], real: int) -> list[np.ndarray]:
        e = self.emit
        feed = {}
        for t in self.walked:
            x = np.zeros(t.shape, self.dtype)
            x[0, ..., : real * t.rate] = frames[t.name][..., : real * t.rate]
            feed[t.name] = x
        for t in self.masks:
            m = np.zeros(t.shape, self.dtype)
            m[..., : real * t.rate] = 1.0
            feed[t.name] = m
        feed.update(self.constants)
        feed.update(self._split())
        outs = self.runner.run(feed)
        if len(outs) != len(self.contract.outputs):
            raise EngineMismatch(f"the engine returned {len(outs)} outputs, its contract lists "
                                 f"{len(self.contract.outputs)}; make a matching one with `{self.contract.remake}`")
        state = np.concatenate([np.asarray(outs[k], self.dtype).reshape(-1) for k in self.state_out])
        if state.size != self.state_floats:
            raise EngineMismatch(f"the engine returned {state.size} state floats, its contract says "
                                 f"{self.state_floats}")
        self.state = state
        self.steps += 1
        drop = min(self._to_drop, e * self.hop)
        self._to_drop -= drop
        pieces = []
        for k, t in zip(self.out_index, self.outputs):
            out = np.asarray(outs[k])
            if out.shape[-1] != e * t.rate:
                raise EngineMismatch(f"{t.name} came back with {out.shape[-1]} samples; the contract says {e * t.rate}")
            pieces.append(out[0, ..., drop:])
        return pieces

    def _join(self, pieces: list[list[np.ndarray]]) -> list[np.ndarray]:
        """Each output's pieces end to end (empty outputs when no step ran)."""
        if not pieces:
            return [np.zeros(t.shape[1:-1] + (0,), self.dtype) for t in self.outputs]
        return [np.concatenate(p, axis=-1) for p in zip(*pieces)]

    def push(self, frames) -> list[np.ndarray]:
        """Add real frames (an array [..., n] when the step has one walked input, else {name: array});
        return each walked output's samples that are now final (possibly none yet)."""
        new = self._frames(frames)
        self._pending = {k: np.concatenate([self._pending[k], new[k]], axis=-1) for k in self._pending}
        self.frames_in += self._n(new)
        e, out = self.emit, []
        while self._n(self._pending) >= e:
            out.append(self._run(self._pending, e))
            self._pending = {t.name: self._pending[t.name][..., e * t.rate:] for t in self.walked}
        return self._join(out)

    def flush(self) -> list[np.ndarray]:
        """End the utterance: run the pending frames, then zero frames with mask 0, until every real
        output sample is out; return them (nothing past the last real sample: rate x frames plus the
        output's `output_extra`)."""
        e, hop = self.emit, self.hop
        emitted = max(self.steps * e * hop - self.delay, 0)   # real samples already returned
        wanted = [self.frames_in * hop + self.extra.get(t.name, 0) - emitted for t in self.outputs]
        out, left, got = [], self._pending, 0
        while got < max(wanted):
            real = min(e, self._n(left))
            out.append(self._run(left, real))
            got += out[-1][0].shape[-1]
            left = {t.name: left[t.name][..., real * t.rate:] for t in self.walked}
        self._pending = left
        return [x[..., :max(w, 0)] for x, w in zip(self._join(out), wanted)]   # every walked output runs at the hop

    def decode(self, frames) -> list[np.ndarray]:
        """One utterance from a fresh state: each walked output over all its frames, flush included."""
        self.reset()
        head, tail = self.push(frames), self.flush()
        # a step whose lookahead is shorter than an output's shortfall has already returned its last samples
        ends = [self.frames_in * self.hop + self.extra.get(t.name, 0) for t in self.outputs]
        return [np.concatenate([a, b], axis=-1)[..., :end] for a, b, end in zip(head, tail, ends)]

    def stream(self, chunks: Iterable) -> Iterator[list[np.ndarray]]:
        """Yield the outputs as they become final while chunks of frames arrive, then the flushed tail."""
        self.reset()
        for frames in chunks:
            out = self.push(frames)
            if out[0].shape[-1]:
                yield out
        yield self.flush()


def carried_feeds(runner, contract: Contract, frames, constants: Mapping[str, np.ndarray] | None = None
                  ) -> list[dict[str, np.ndarray]]:
    """The feed of every whole step while `runner` walks `frames` (as StatefulWalker.push takes them)
    from a zero state, each input in its contract dtype: every feed after the first carries the state
    the runner left there, a cache with a real past. The stage-2 probes of stateful steps and the
    calibration and evaluation sets of a stream come from here, so what a gate or the quantizer sees
    of the cache path is what a walk feeds."""
    recording = Recording(runner)
    StatefulWalker(ContractDtypes(recording, contract), contract, constants).push(frames)
    return recording.feeds
