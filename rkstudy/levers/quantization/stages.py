"""A stage as the quantization lever sees it (host): its engine graph, calibration feeds recorded from a
real walk, evaluation items held apart from them, and the scores every stage reports.

Its own module because every family's `quantization_stage` builds one and needs nothing else of the lever:
a family imports this, never the search or the bench.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ... import gates
from ...runtime import OrtRunner, Recording


@dataclass
class Stage:
    """One stage to quantize: its engine graph, the calibration feeds ({input: array} per sample, what
    the engine really sees), the evaluation items (never among the calibration's sources), `walk(runner,
    item) -> 1-D output` that runs an item through any runner, and `score(items, refs, tests) -> {column:
    value}` over those items' outputs (per window and per utterance SNR for a decoder).

    `search` are the items that steer a search (a few windows held apart from the calibration like the
    evaluation; default: the first evaluation item); `rate` and `audio`
    (a walk output -> its audio at `rate`; None when the stage's output is not audio, e.g. an encoder's
    statistics) let a listener's scores be computed; `speech` says the audio is speech (DNSMOS, which
    needs no reference, means something only then). `groups` maps a node's module path
    ('/dec/resblocks.3/convs1.0') to the group a search moves as one (default: its first two levels).
    `outputs` holds the last measurements' outputs per setting ("fp32" the reference), one 1-D array per
    evaluation item, for a notebook to listen to."""

    name: str
    onnx: Path
    calibration: list[Mapping[str, np.ndarray]]
    evaluation: list
    walk: Callable
    score: Callable[[list, list, list], dict]
    texts: dict = field(default_factory=dict)
    outputs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    search: list | None = None
    rate: int | None = None
    audio: Callable[[np.ndarray], np.ndarray] | None = None
    speech: bool = True
    groups: Callable[[str], str] | None = None

    def items(self, which: str) -> list:
        """The items of a measurement: 'full' (every evaluation item) or 'search' (the search items)."""
        if which == "full":
            return list(self.evaluation)
        return list(self.search) if self.search is not None else list(self.evaluation[:1])

    @property
    def listens(self) -> bool:
        return self.audio is not None and self.rate is not None


def held_apart(calibration: Sequence[str], evaluation: Sequence[str]) -> None:
    """Refuse a quantization set-up whose calibration and evaluation share a source (a text, an
    utterance): a score on data the ranges were fitted to flatters the quantizer."""
    shared = sorted(set(calibration) & set(evaluation))
    if shared:
        raise ValueError(f"{', '.join(shared)} would both calibrate and score; hold the evaluation texts apart")


def recorded_feeds(onnx: Path, walk: Callable, items: Sequence) -> list[dict[str, np.ndarray]]:
    """Every feed `walk` hands an onnxruntime fp32 run of `onnx` over `items`, in order: a stage's
    calibration set is what its engine sees in a real walk (its windows with their padding, or its
    steps with the state the fp32 walk carried into them), not a tensor made up to fit its shapes."""
    recorder = Recording(OrtRunner(onnx))
    for item in items:
        walk(recorder, item)
    return recorder.feeds


def evenly(items: Sequence, k: int | None) -> list:
    """`k` of `items` evenly spread from first to last (all of them when k is None or covers them):
    a calibration set cut to what a build can afford still spans every sentence it was drawn from."""
    if k is None or len(items) <= k:
        return list(items)
    return [items[int(i)] for i in np.linspace(0, len(items) - 1, k).round()]


def span_scores(refs: Sequence[np.ndarray], tests: Sequence[np.ndarray],
                spans: Sequence[Sequence[tuple[int, int]]]) -> dict:
    """The score columns every stage reports: the SNR against fp32 of each window (`spans`: each
    evaluation item's [start, stop) sample ranges, one per window or step), its worst and median,
    and the SNR of all items' outputs back to back (`utterance_snr_db`)."""
    windows = [gates.snr_db(a[lo:hi], b[lo:hi]) for a, b, item in zip(refs, tests, spans) for lo, hi in item]
    return {"windows": len(windows), "window_snr_db_min": float(np.min(windows)),
            "window_snr_db_median": float(np.median(windows)),
            "utterance_snr_db": gates.snr_db(np.concatenate(refs), np.concatenate(tests))}


def listening(stage: Stage, refs: Sequence[np.ndarray], tests: Sequence[np.ndarray], absolute: bool = True) -> dict:
    """What a listener would judge of the test render against fp32 (rkstudy.gates.perceptual: PESQ-WB,
    STOI, log-mel distance, and with `absolute` and speech, DNSMOS of both), on every item's audio back
    to back, as `utterance_snr_db` is; empty for a stage whose output is not audio."""
    if not stage.listens:
        return {}
    ref = np.concatenate([np.asarray(stage.audio(r), np.float32).ravel() for r in refs])
    test = np.concatenate([np.asarray(stage.audio(t), np.float32).ravel() for t in tests])
    return gates.perceptual(ref, test, stage.rate, absolute=absolute and stage.speech)
