"""Notebook 03 section 3 (fp32): each rewrite against kokoro's own Generator, a traced weight norm,
and the Snake sine: the minimax fits, the real arguments, each form's error at the output."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace

import torch

from ... import gates, graph
from ...tables.results import HOST
from . import frontend, generator
from .generator import ENGINE, REFERENCE, Rewrites
from .producer import DEFAULT_FRAMES, KokoroModel, full_feed, run_torch
from .rows import FP32

REWRITE_SETS = (  # none, one rewrite at a time, then all of them (the engine's graph)
    ("none (the re-traced trunk)", REFERENCE),
    ("masked instance norm via GAP", replace(REFERENCE, masked=True)),
    ("alpha fold", replace(REFERENCE, alpha_fold=True)),
    ("split dilated convs", replace(REFERENCE, split_dilated=True)),
    ("polyphase ups.0", replace(REFERENCE, polyphase=True)),
    ("sine: range-reduced poly 5", replace(REFERENCE, sine="poly", degree=5)),
    ("sine: clipped poly 5", replace(REFERENCE, sine="clip", degree=5)),
    ("every exact rewrite, exact sine", Rewrites(sine="exact")),
    ("the engine's graph", ENGINE),
)


def rewrite_rows(model: KokoroModel, utt: frontend.Utterance) -> list[dict]:
    """Each rewrite against kokoro's own Generator (exact sine, full length, masks all ones), fp32.
    Weight norm is folded at load for all of them: the int8 export stores the effective kernels."""
    with torch.no_grad():
        ref = generator.reference_trunk(model.generator, *(torch.from_numpy(a) for a in (utt.x, utt.style,
                                                                                          utt.har))).numpy()
    feed = full_feed(utt)
    return [{"rewrite": name, "tag": rw.tag(), "snr_vs_kokoro_db": gates.snr_db(ref, run_torch(model.trunk(rw), feed)),
             **FP32} for name, rw in REWRITE_SETS]


def sine_fit_rows(degrees=generator.DEGREES) -> list[dict]:
    """The odd minimax fits of sin on [-pi, pi]: coefficients and the largest error on a dense grid."""
    r = torch.linspace(-math.pi, math.pi, 200001, dtype=torch.float64)
    rows = []
    for d in degrees:
        c = generator.minimax_sine(d)
        err = (generator.odd_poly(r, c) - torch.sin(r)).abs().max().item()
        rows.append({"degree": d, "coefficients": " ".join(f"{v:.10g}" for v in c), "max_abs_error": err, **FP32})
    return rows


def weight_norm_rows(model: KokoroModel, frames: int = DEFAULT_FRAMES) -> list[dict]:
    """What a traced weight norm hands the compiler: the trunk re-parametrized with weight norm,
    exported without and with torch's constant folding (which then folds the norm itself)."""
    from .producer import export, window_shapes

    trunk = model.trunk(Rewrites(weight_norm=True))
    rows = []
    for folding in (False, True):
        c = graph.census(export(trunk, window_shapes(frames), fold=False, constant_folding=folding), with_axis=False)
        rows.append({"window": frames, "torch_constant_folding": folding, "nodes": c.nodes,
                     "ReduceL2": c.ops.get("ReduceL2", 0), "where": HOST.where, "target": HOST.target})
    return rows




@contextmanager
def sine_arguments(trunk: generator.GeneratorTrunk, fn):
    """Inside, every Snake calls `fn(argument)` with the argument its sine sees."""
    blocks = [m for m in trunk.modules() if isinstance(m, generator.ResBlock)]

    def wrap(block):
        original = block.snake

        def snake(y, k, which):
            fn((y if block.rw.alpha_fold else getattr(block, f"a{which}_{k}") * y).detach())
            return original(y, k, which)
        return snake

    for b in blocks:
        b.snake = wrap(b)
    try:
        yield
    finally:
        for b in blocks:
            del b.snake


class SineStats:
    """Streaming sine-level error of every form on the arguments it is fed."""

    def __init__(self, degrees=generator.DEGREES):
        self.count = self.past_pi = 0
        self.max_abs = self.signal = 0.0
        self.err = {(form, d): 0.0 for form in ("poly", "clip") for d in degrees}

    def __call__(self, t: torch.Tensor):
        t = t.double()
        exact = torch.sin(t)
        self.count += t.numel()
        self.past_pi += int((t.abs() > math.pi).sum())
        self.max_abs = max(self.max_abs, float(t.abs().max()))
        self.signal += float((exact * exact).sum())
        for form, d in self.err:
            self.err[(form, d)] += float(((generator.sine(t, form, d) - exact) ** 2).sum())

    def rows(self) -> list[dict]:
        return [{"form": "range-reduced" if form == "poly" else "clipped", "degree": d,
                 "sine_snr_db": 10 * math.log10(self.signal / e), **FP32} for (form, d), e in self.err.items()]

    def summary(self, utt: frontend.Utterance) -> dict:
        return {"utterance": utt.name, "frames": utt.frames, "arguments": self.count, "past_pi": self.past_pi,
                "past_pi_share": self.past_pi / self.count, "max_abs_argument": self.max_abs, **FP32}


def sine_rows(model: KokoroModel, utt: frontend.Utterance) -> tuple[dict, list[dict], list[dict]]:
    """The Snake arguments of a full-length decode (share past pi, largest), the sine-level SNR of each
    form and degree on exactly those arguments, and the generator output of each form against the
    exact sine (full length, fp32)."""
    feed = full_feed(utt)
    stats = SineStats()
    exact = model.trunk(Rewrites(sine="exact"))
    with sine_arguments(exact, stats):
        ref = run_torch(exact, feed)
    out = []
    for form in ("poly", "clip"):
        for d in generator.DEGREES:
            got = run_torch(model.trunk(Rewrites(sine=form, degree=d)), feed)
            out.append({"form": "range-reduced" if form == "poly" else "clipped", "degree": d,
                        "gen_snr_vs_exact_db": gates.snr_db(ref, got), **FP32})
    return stats.summary(utt), stats.rows(), out
