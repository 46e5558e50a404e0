"""The generator window as rkstudy.levers.quantization sees it (notebook 08's quantization section):
calibrated on real Japanese utterances, scored on others."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...walk.window import plan_windows
from . import frontend, head
from .producer import DEFAULT_CONTEXT, DEFAULT_FRAMES, KokoroModel, load_model, produce
from .walks import sidecar, walk_gen

QUANT_CALIBRATION_UTTERANCES = ("medium",)
QUANT_EVALUATION_UTTERANCES = ("short",)


def quantization_stage(model: KokoroModel | None = None, frames: int = DEFAULT_FRAMES, context: int = DEFAULT_CONTEXT,
                       calibration_utterances: Sequence[str] = QUANT_CALIBRATION_UTTERANCES,
                       evaluation_utterances: Sequence[str] = QUANT_EVALUATION_UTTERANCES,
                       calibration_windows: int | None = None):
    """The `frames`-frame generator window as rkstudy.levers.quantization sees it: the calibration feeds are the
    windows an fp32 walk feeds the engine over the real Japanese utterances `calibration_utterances`
    (x, har and style from the shipped front end; `calibration_windows` of them evenly spread), the
    evaluation utterances are walked through the sidecar and scored on gen (conv_post's rows, what
    the host's iSTFT head turns into audio) per window's emitted frames and per utterance."""
    from ...levers.quantization.stages import Stage, evenly, held_apart, recorded_feeds, span_scores
    from ...levers.quantization.tensors import first_levels

    held_apart(calibration_utterances, evaluation_utterances)
    model = model or load_model()
    produced = produce(frames, context, model=model)
    emit, fine = frames - 2 * context, produced.contract.params["fine_per_frame"]
    evaluation = [model.utterance(name) for name in evaluation_utterances]

    def generate(runner, utt):
        gen = walk_gen(sidecar(runner, produced.contract), utt)[0]
        return np.ascontiguousarray(gen.T).ravel()  # time-major: a window's frames are one span

    rows = produced.contract.params["rows"]

    def score(items, refs, tests):
        return span_scores(refs, tests, [[(fine * w.emit_start * rows, fine * w.emit_stop * rows)
                                          for w in plan_windows(utt.frames, emit, context)] for utt in items])

    def audio(gen):  # time-major gen rows back to (rows, frames), through the host's iSTFT head
        return head.istft(np.asarray(gen, np.float32).reshape(-1, rows).T, model.head)

    calibration = [model.utterance(name) for name in calibration_utterances]
    return Stage(name=f"Kokoro generator W={frames}", onnx=produced.path,
                 calibration=evenly(recorded_feeds(produced.path, generate, calibration), calibration_windows),
                 evaluation=evaluation, walk=generate, score=score, rate=frontend.SAMPLE_RATE, audio=audio,
                 groups=lambda module: first_levels(module, 1),
                 texts={"calibration": ", ".join(f"ja_{n}" for n in calibration_utterances),
                        "evaluation": ", ".join(f"ja_{n}" for n in evaluation_utterances)})
