"""The Qwen3 vocoder sidecar (board side): codes of any length in, 24 kHz PCM out, over compiled
streaming steps on any runner (fp32, simulator, board, replay).

A step engine voices `codes_length` tokens and carries one flat fp32 cache from `cache_out` back to
`cache_in` (the contract's one state pair); rkstudy.walk.stateful.StatefulWalker walks it. The step is
causal (no lookahead), so the walker's flush is one zero-padded step: padding after the last real
token changes none of the real samples. Three ways to run it, as the reference documents' runtime has them:

* offline: every token on the main (64-token) engine, from a zeroed cache;
* streaming: the first group on the `first` (16-token) engine, so the first audio waits for 16
  tokens instead of 64, then the cache goes to the main engine as it is (its layout does not depend
  on the batch size; the sidecar refuses engines whose caches differ) and every later group runs
  there. Each token is voiced once; the stream equals one full decode;
* window: every event re-voices up to `left_context` previous tokens and its own from a zeroed
  cache, and drops the context's audio (the package's own streaming function,
  `chunked_decode(chunk_size, left_context_size)`, event by event; `cache_out` is ignored).

Board side: numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ...contract import Contract
from ...errors import EngineMismatch
from ...runtime.wrappers import ContractDtypes
from ...walk.stateful import StatefulWalker

FAMILY = "qwen3_vocoder"
SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = 1920  # prod(upsample_rates + upsampling_ratios) = 8*5*4*3*2*2
NUM_QUANTIZERS = 16
CODEBOOK_SIZE = 2048
LEFT_CONTEXT = 25  # the package's chunked_decode default
CODES, CACHE_IN, AUDIO, CACHE_OUT = "codes", "cache_in", "audio", "cache_out"
# the contract params that must agree for two engines to share one cache
SHARED = ("cache_numel", "cache_layout_sha256", "num_quantizers", "samples_per_token")


def random_codes(n_tokens: int, seed: int = 0, codebook_size: int = CODEBOOK_SIZE,
                 num_quantizers: int = NUM_QUANTIZERS) -> np.ndarray:
    """Uniform random codes `[1, num_quantizers, n_tokens]` int64 (what the talker hands over; the
    weights are seeded random, so any codes are as good as a talker's)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, codebook_size, size=(1, num_quantizers, n_tokens), dtype=np.int64)


def check_engine(contract: Contract) -> None:
    """The contract is a vocoder step this sidecar can walk: family, one cache state pair, no lookahead."""
    contract.check_family(FAMILY)
    fix = f"; make a matching one with `{contract.remake}`"
    if [t.name for t in contract.inputs] != [CODES, CACHE_IN] or contract.state != ((CACHE_IN, CACHE_OUT),):
        raise EngineMismatch(f"the {FAMILY} step takes codes and cache_in and pairs cache_out with cache_in; this "
                             f"contract has inputs {contract.input_names} and state {list(contract.state)}" + fix)
    contract.check_params({k: ... for k in ("codes_length",) + SHARED}, what="vocoder step")


class VocoderSidecar:
    """Codes `[Q, T]` (or `[1, Q, T]`) to PCM over a main step engine and an optional first one."""

    def __init__(self, main, main_contract: Contract, first=None, first_contract: Contract | None = None):
        check_engine(main_contract)
        self.main = StatefulWalker(ContractDtypes(main, main_contract), main_contract)
        self.first = None
        if first is not None:
            if first_contract is None:
                raise EngineMismatch("pass the first engine's contract with it (its .contract.json)")
            check_engine(first_contract)
            differ = [k for k in SHARED if first_contract.params[k] != main_contract.params[k]]
            if differ or first_contract.source != main_contract.source:
                raise EngineMismatch(
                    f"the first ({first_contract.params['codes_length']}-token) and main "
                    f"({main_contract.params['codes_length']}-token) engines do not share one cache "
                    f"({', '.join(differ) or 'source weights'} differ): make both from one model with "
                    f"`{main_contract.remake}` and --codes-length 16")
            self.first = StatefulWalker(ContractDtypes(first, first_contract), first_contract)
        self.contract = main_contract
        self.steps: list[tuple[int, int]] = []  # (engine's codes_length, walker steps) per decode/stream

    # --- inputs -------------------------------------------------------------------------------
    def _codes(self, codes) -> np.ndarray:
        q = self.contract.params["num_quantizers"]
        c = np.asarray(codes)
        if c.ndim == 3 and c.shape[0] == 1:
            c = c[0]
        if c.ndim != 2 or c.shape[0] != q:
            raise EngineMismatch(f"codes have shape {np.shape(codes)}; this engine takes [{q}, T] "
                                 f"({q} quantizers, any number of tokens)")
        return c.astype(np.float32)

    @staticmethod
    def _pcm(out: list[np.ndarray]) -> np.ndarray:
        return np.asarray(out[0], np.float32).reshape(-1)

    # --- offline, streaming, window --------------------------------------------------------------
    def decode(self, codes) -> np.ndarray:
        """Offline: every token on the main engine from a zeroed cache."""
        pcm = self._pcm(self.main.decode(self._codes(codes)))
        self.steps = [(self.main.emit, self.main.steps)]
        return pcm

    def stream(self, chunks: Iterable) -> Iterator[np.ndarray]:
        """Streaming: PCM as soon as it is final while code chunks `[Q, n]` arrive (the first group on
        the first engine, the rest on the main one, one cache throughout), then the flushed tail."""
        self.main.reset()
        if self.first is None:
            for out in self.main.stream(self._codes(c) for c in chunks):
                if out[0].size:
                    yield self._pcm(out)
            self.steps = [(self.main.emit, self.main.steps)]
            return
        self.first.reset()
        e1, pending, handed = self.first.emit, None, False
        for chunk in chunks:
            c = self._codes(chunk)
            if not handed:
                pending = c if pending is None else np.concatenate([pending, c], axis=-1)
                if pending.shape[-1] < e1:
                    continue
                yield self._pcm(self.first.push(pending[:, :e1]))
                self.main.state = self.first.state.copy()  # the 16-token cache is the 64-token one
                handed, c = True, pending[:, e1:]
            out = self.main.push(c)
            if out[0].size:
                yield self._pcm(out)
        if handed:
            yield self._pcm(self.main.flush())
        elif pending is not None:  # a stream shorter than the first group
            self.first.push(pending)
            yield self._pcm(self.first.flush())
        self.steps = [(self.first.emit, self.first.steps)] + ([(self.main.emit, self.main.steps)] if handed else [])

    def window_event(self, context, codes) -> np.ndarray:
        """Window role, one event: voice [context + codes] from a zeroed cache on the main engine and
        return the new tokens' PCM only (`context` [Q, c]: up to LEFT_CONTEXT previous tokens)."""
        ctx, new = self._codes(context), self._codes(codes)
        if ctx.shape[-1] + new.shape[-1] > self.main.emit:
            raise EngineMismatch(f"an event of {new.shape[-1]} tokens with {ctx.shape[-1]} of context needs a "
                                 f"{ctx.shape[-1] + new.shape[-1]}-token step; this engine has {self.main.emit}")
        pcm = self._pcm(self.main.decode(np.concatenate([ctx, new], axis=-1)))
        return pcm[ctx.shape[-1] * SAMPLES_PER_TOKEN:]

    def window_stream(self, chunks: Iterable, left_context: int = LEFT_CONTEXT) -> Iterator[np.ndarray]:
        """Window role over events: each re-voices up to `left_context` previous tokens."""
        history = None
        for chunk in chunks:
            c = self._codes(chunk)
            ctx = np.zeros((c.shape[0], 0), np.float32) if history is None else history[:, -left_context:]
            if not left_context:
                ctx = ctx[:, :0]
            yield self.window_event(ctx, c)
            history = c if history is None else np.concatenate([history, c], axis=-1)


def gather(stream: Iterable[np.ndarray], t0: float, each=None) -> tuple[np.ndarray, float | None]:
    """A stream's PCM pieces joined, and the seconds from `t0` (time.perf_counter) to its first
    non-empty piece: a streaming decode's time to first audio. `each(piece)`, if given, hears every piece as it
    is made (a --stream sink)."""
    import time

    first_audio, pieces = None, []
    for pcm in stream:
        if first_audio is None and pcm.size:
            first_audio = time.perf_counter() - t0
        if each is not None:
            each(pcm)
        pieces.append(pcm)
    return np.concatenate(pieces), first_audio


def events(codes, size: int) -> list[np.ndarray]:
    """`codes [Q, T]` (or [1, Q, T]) cut into events of `size` tokens (the last one shorter)."""
    c = np.asarray(codes)
    c = c[0] if c.ndim == 3 else c
    return [c[:, i:i + size] for i in range(0, c.shape[-1], size)]
