"""The window planner's view of this generator (notebook 03's planner cell, `rkstudy plan-window`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ...toolkit.build import BuildReport
from ...walk.planner import PlanTarget
from . import frontend, generator, head
from .generator import ENGINE
from .global_statistics import torch_walk
from .producer import DEFAULT_CONTEXT, DEFAULT_FRAMES, INPUTS, KokoroModel, load_model, produce, run_torch, window_feed


@dataclass(frozen=True)
class Seam:
    """One utterance's generator inputs as the planner walks them (x [512, N], har [22, 60N+1], style
    [1, 128]); `origin` is the unperturbed x, whose statistics the frozen-statistics decode replays."""

    x: np.ndarray
    har: np.ndarray
    style: np.ndarray
    origin: np.ndarray | None = None

    @property
    def frames(self) -> int:
        return int(self.x.shape[-1])


PLAN_CONTEXTS = (0, 8, 16, 28, 40)


def plan_target(model: KokoroModel | None = None, names: Sequence[str] = ("short", "medium"),
                contexts: Sequence[int] = PLAN_CONTEXTS) -> PlanTarget:
    """The generator as rkstudy.walk.planner sees it: the fp32 trunk at full length (audio through the
    numpy head), its walk at any window (the same trunk per window: the compiled graph depends only on
    the window length), real utterances, the reference documents' 128 = 72 + 2 x 28 window, and a frozen-statistics
    decode whose receptive field is the convolutions' own reach (the trunk's per-window AdaIN
    statistics make every frame reach the whole window)."""
    model = model or load_model()
    trunk = model.trunk()
    latents = [Seam(u.x[0], u.har[0], u.style) for u in (model.utterance(n) for n in names)]

    def feed(lat: Seam, x=None):
        n = lat.frames
        return window_feed((lat.x if x is None else x)[None], lat.har[None], lat.style, 0, n, n)

    def decode(lat: Seam) -> np.ndarray:
        return head.istft(run_torch(trunk, feed(lat)), model.head)

    def frozen(lat: Seam) -> np.ndarray:
        base = feed(lat, lat.origin)
        items = generator.record_statistics(trunk, *(torch.from_numpy(base[k]) for k in INPUTS))
        with generator.replaying(trunk, items):
            return head.istft(run_torch(trunk, feed(lat)), model.head)

    def perturb(lat: Seam, k: int, rng) -> Seam:
        x = lat.x.copy()
        x[:, k] = rng.standard_normal(x.shape[0]).astype(np.float32) * float(np.std(lat.x))
        return replace(lat, x=x, origin=lat.x)

    def walked(lat: Seam, emit: int, context: int) -> np.ndarray:
        u = frontend.Utterance(name="plan", text="", voice="", speed=1.0, phonemes="", tokens=np.zeros(0),
                               style256=np.zeros(0), x=lat.x[None], har=lat.har[None], style=lat.style,
                               f0=np.zeros(0), gen=np.zeros(0), audio=np.zeros(0))
        return head.istft(torch_walk(trunk, u, emit + 2 * context, context), model.head)

    def noise_like(lats, seed):
        rng = np.random.default_rng(seed)
        scale = float(np.std(np.concatenate([v.x.ravel() for v in lats])))
        return [replace(v, x=(rng.standard_normal(v.x.shape) * scale).astype(np.float32)) for v in lats]

    def engine(window: int):
        return produce(window, min(DEFAULT_CONTEXT, (window - 1) // 2), model=model).path

    return PlanTarget(family="kokoro_generator", hop=frontend.HOP, decode=decode, engine=engine, latents=latents,
                      default_emit=DEFAULT_FRAMES - 2 * DEFAULT_CONTEXT, default_context=DEFAULT_CONTEXT,
                      walk=walked, perturb=perturb, noise_like=noise_like, n_frames=lambda lat: lat.frames,
                      contexts=contexts, variants={"frozen statistics": frozen})


def known_builds(rows: Sequence[dict]) -> dict[tuple[int, str], BuildReport]:
    """The sweep's builds as the planner's `known` builds: {(window, target): report} for each row of a
    one-window engine with the default rewrites that was built (rows of builds not made, other
    rewrites and in-graph walks answer nothing: the planner builds those windows itself)."""
    one_window = [r for r in rows
                  if r.get("rewrites") == ENGINE.tag() and not r.get("max_axis") and r.get("engine_mb", "") != ""]
    return {(int(r["window"]), r["target"]): BuildReport(
                status=r["status"], target=r["target"], onnx="", engine=None,
                engine_bytes=int(float(r["engine_mb"]) * 1e6), seconds=float(r["build_s"]), regtask=int(r["regtask"]),
                toolkit_version="", log="", regtask_max=int(r["regtask_max_value"]))
            for r in one_window}
