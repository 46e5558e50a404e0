"""The Qwen3 vocoder's measurements (host): what notebook 04 and the producer's self-check call.

The weights are seeded random (the checkpoint is not obtainable here), so every gate below is
structural: stepwise vs full decode, the 16 -> 64 cache hand-over and the simulator against fp32
compare two computations of the same function, and hold for any weights. None of these numbers is
an audio-quality figure.

Every row carries `where` and `target`: torch fp32 rows say fp32 (the same CPU reference class as
onnxruntime), simulator rows take them from the SimulatorRunner, builds from the BuildReport,
graph counts from rkstudy.tables.results.HOST.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from ... import gates
from ...tables.results import HOST
from ...toolkit.build import build_engine
from .sidecar import SAMPLE_RATE, SAMPLES_PER_TOKEN, random_codes

GATE = gates.Gate("stepwise_vs_full_decode", 40.0)   # the reference documents' self-check gate
FP32 = {"where": "fp32", "target": "none"}
HOST_ROW = {"where": HOST.where, "target": HOST.target}
CODES_SEED = 7
CALIBRATION_SEED = 1234  # int8 calibration codes: a different stream from every evaluation's


def heard(reference, pcm) -> dict:
    """PESQ-WB, STOI and the log-mel distance of `pcm` against `reference` (rkstudy.gates.perceptual without
    DNSMOS: with random weights the vocoder voices noise, not speech, so an absolute speech-quality score would
    rate the noise; the relative scores still say how far two computations of the same function are apart, as
    the SNR does). A render with non-finite samples gets NaN, as it has no perceptual score."""
    reference, pcm = np.asarray(reference).ravel(), np.asarray(pcm).ravel()
    if gates.nonfinite_count(pcm) or gates.nonfinite_count(reference):
        return dict.fromkeys(gates.RELATIVE_COLUMNS, float("nan"))
    return gates.perceptual(reference, pcm, SAMPLE_RATE, absolute=False)


@lru_cache(maxsize=4)
def decoder(widths: str = "released", seed: int = 0):
    """The seeded decoder (made once per process: 114 M parameters at the released widths)."""
    import torch

    from .producer import decoder_for

    torch.set_num_threads(1)
    return decoder_for(widths, seed)


def steps_for(dec, sizes) -> dict:
    """numpy step functions of `dec` at each batch size (torch fp32)."""
    from .step import StreamingStep, torch_step_fn

    return {b: torch_step_fn(StreamingStep(dec, b)) for b in sizes}


def _codes(dec, n: int, seed: int) -> np.ndarray:
    return random_codes(n, seed, codebook_size=dec.config.codebook_size, num_quantizers=dec.config.num_quantizers)


def stepwise_row(dec, steps: dict, codes: np.ndarray, schedule, reference: np.ndarray) -> dict:
    """Decode `codes` group by group along `schedule` from a zeroed cache and score it against one
    full decode of the same codes (GATE)."""
    from .step import cache_layout, stepwise_decode, zero_cache

    t0 = time.monotonic()
    got, _ = stepwise_decode(steps, codes, list(schedule), zero_cache(cache_layout(dec)))
    seconds = round(time.monotonic() - t0, 1)
    return {"schedule": "+".join(map(str, schedule)), "tokens": int(codes.shape[-1]), "expected": "pass",
            **GATE.row(gates.snr_db(reference, got)), **heard(reference, got), "seconds": seconds, **FP32}


def self_check(codes_length: int, *, widths: str = "released", seed: int = 0, groups: int = 3) -> dict:
    """The producer's gate: `groups` steps of `codes_length` tokens against one full decode
    (raises GateFailed below 40 dB)."""
    from .model import full_decode

    dec = decoder(widths, seed)
    codes = _codes(dec, groups * codes_length, CODES_SEED)
    row = stepwise_row(dec, steps_for(dec, [codes_length]), codes, [codes_length] * groups, full_decode(dec, codes))
    GATE.check(row["measured"], context=f"stepwise {row['schedule']} vs full decode, torch fp32")
    return row


def gate_rows(dec, schedules, seed: int = CODES_SEED) -> list[dict]:
    """Stepwise vs full decode for each schedule (lists of batch sizes summing to one token count),
    the 16 -> 64 hand-over alone, and the negative control (every step from a zeroed cache)."""
    from .model import full_decode
    from .step import cache_layout, zero_cache

    n = sum(schedules[0])
    if any(sum(s) != n for s in schedules):
        raise ValueError("every schedule must cover the same tokens")
    sizes = sorted({b for s in schedules for b in s})
    steps = steps_for(dec, sizes)
    codes = _codes(dec, n, seed)
    ref = full_decode(dec, codes)
    rows = [stepwise_row(dec, steps, codes, s, ref) for s in schedules]
    small, big = sizes[0], sizes[-1]
    zero = zero_cache(cache_layout(dec))
    if small != big and n >= small + big:
        _, cache = steps[small](codes[..., :small], zero)
        wav, _ = steps[big](codes[..., small:small + big], cache)
        part = ref[small * SAMPLES_PER_TOKEN:(small + big) * SAMPLES_PER_TOKEN]
        rows.append({"schedule": f"{small}-token cache -> {big}-token step (hand-over alone)", "tokens": big,
                     "expected": "pass", **GATE.row(gates.snr_db(part, wav)), **heard(part, wav), "seconds": "",
                     **FP32})
    pieces = [steps[small](codes[..., i:i + small], zero)[0] for i in range(0, n - n % small, small)]
    part, got = ref[: len(pieces) * small * SAMPLES_PER_TOKEN], np.concatenate(pieces)
    rows.append({"schedule": f"control: every {small}-token step from a zeroed cache",
                 "tokens": n - n % small, "expected": "miss", **GATE.row(gates.snr_db(part, got)), **heard(part, got),
                 "seconds": "", **FP32})
    return rows


def layout_rows(dec) -> list[dict]:
    """The flat cache by kind of state: KV history, validity flags, conv tails, transposed-conv frames."""
    from .step import cache_layout

    lay = cache_layout(dec)
    groups = lay.by_group()
    return [{"state": k, "floats": v, "share": v / lay.numel, "tensors": sum(
        1 for s in lay.segments if _kind(s.name) == k), **HOST_ROW} for k, v in groups.items()]


def _kind(name: str) -> str:
    return ("kv" if name.endswith((".k", ".v")) else "valid" if name == "attn.valid"
            else "upconv" if name.endswith(".upconv") else "conv")


def contract_rows(paths: dict) -> list[dict]:
    """Each produced graph's contract, read back out of the graph as stage 2 reads it."""
    from .producer import contract_row, read_contract

    rows = []
    for label, path in paths.items():
        c = read_contract(path)
        rows.append({"graph": label, **contract_row(c), "state_pairs": len(c.state),
                     "cache_layout_sha256": c.params["cache_layout_sha256"][:16], "exporter": c.params["exporter"],
                     "widths": c.params["widths"], **HOST_ROW})
    return rows


def census_rows(products: dict, build_target: str | None = "rk3588", shapes: dict | None = None) -> list[dict]:
    """Per exporter setting: the census, the predicted abort, and (with `build_target`) the build
    outcome through the subprocess wrapper (status ok / failed / aborted, REGTASK lines, size).
    `shapes` pins a graph with a dynamic axis to the static export's shapes."""
    from .producer import predict_abort

    rows = []
    for label, product in products.items():
        if isinstance(product, str):  # the exporter could not run here: say why
            rows.append({"exporter": label, "nodes": "", "predicted_abort": "", "why": "",
                         "build": "not run", "note": product, **HOST_ROW})
            continue
        abort, why = predict_abort(product.census)
        row = {"exporter": label, **{k: v for k, v in product.row().items() if k != "exporter"},
               "predicted_abort": abort, "why": why}
        if build_target:
            report = build_engine(product.path, build_target, shapes=shapes, reuse=True)
            row.update({"build": report.status, **{k: v for k, v in report.row().items() if k != "status"}})
            rows.append(row)
        else:
            rows.append({**row, "build": "not built", **HOST_ROW})
    return rows


def engine_rows(onnx_path, targets, out_dir=None, steps: int = 3, keep_last: int | None = None,
                quantize=None) -> list[dict]:
    """The fp16 engine (or, with `quantize`, a rkstudy.toolkit.calibration.Calibration, the quantized one) for each
    target: REGTASK lines, size, and the simulator against onnxruntime fp32 on each step of a
    carried-cache stream (audio and cache_out SNR, non-finite counts; the step's audio by PESQ-WB, STOI and
    the log-mel distance, `heard`); with `keep_last`, only the
    last steps (a released-width step takes minutes in the simulator)."""
    from pathlib import Path

    from ...toolkit.convert import compare_outputs, simulator_vs_fp32
    from .producer import carried_feeds, read_contract

    c = read_contract(onnx_path)
    feeds = carried_feeds(onnx_path, steps, CODES_SEED + 1)
    first = len(feeds) - (keep_last or len(feeds))
    feeds = feeds[first:]
    rows = []
    for target in targets:
        name = f"{Path(onnx_path).stem}-{target}{'-int8' if quantize else ''}.rknn"
        out = Path(out_dir) / name if out_dir else None
        sim = simulator_vs_fp32(onnx_path, target, feeds, out=out, quantize=quantize,
                                compare=lambda ref, test, item: {**compare_outputs(ref, test, ["audio", "cache_out"]),
                                                                 **heard(ref[0], test[0])})
        for k, r in enumerate(sim.rows):
            rows.append({"codes_length": c.params["codes_length"], "step": first + k, **sim.report.row(),
                         "audio_snr_db": r["audio_snr_db"], **{col: r[col] for col in gates.RELATIVE_COLUMNS},
                         "cache_out_snr_db": r["cache_out_snr_db"],
                         "audio_nonfinite": r["audio_nonfinite"], "cache_out_nonfinite": r["cache_out_nonfinite"],
                         "simulator_s": round(sim.seconds[k], 2), "where": r["where"], "target": r["target"]})
    return rows


def calibration(onnx_path, steps: int = 4, seed: int = CALIBRATION_SEED):
    """The int8 calibration set: the (codes, cache_in) feeds of `steps` consecutive steps of a
    random-code stream (codes from `seed`, not the evaluation codes' seed), the cache carried by
    onnxruntime fp32, so the quantizer sees the ranges a stream feeds (a zeroed cache and real
    history), with the toolkit's default settings (w8a8, min/max, per-channel)."""
    from ...toolkit.calibration import Calibration
    from .producer import carried_feeds

    return Calibration(carried_feeds(onnx_path, steps, seed))


def int8_rows(onnx_path, target: str = "rk3588", out_dir=None, steps: int = 3, keep_last: int | None = None,
              calibration_steps: int = 4, fp16: list[dict] | None = None) -> list[dict]:
    """fp16 against int8 (w8a8) in the simulator, each against onnxruntime fp32 on the same carried
    evaluation steps engine_rows runs. `fp16` takes the engine table's rows of this graph and target
    (the same function on the same feeds) instead of building the fp16 engine again. With seeded
    random weights the int8 SNR measures the quantizer on these activations, not on the released
    model's (the Snake's sin^2 is what the reference documents blame)."""
    from .producer import read_contract

    n = read_contract(onnx_path).params["codes_length"]
    if fp16 is None:
        fp16 = engine_rows(onnx_path, [target], out_dir, steps, keep_last)
    fp16 = [r for r in fp16 if r["codes_length"] == n and r["target"] == target and r["audio_snr_db"] != ""]
    if not fp16:
        raise ValueError(f"no simulated fp16 row of the {n}-token step on {target} to compare int8 with")
    cal = calibration(onnx_path, calibration_steps)
    int8 = engine_rows(onnx_path, [target], out_dir, steps, keep_last, quantize=cal)
    fp16 = [{k: r[k] for k in int8[0]} for r in fp16]  # the engine table's rows, in engine_rows' columns
    return [{**r, "calibration": f"{len(cal.feeds)} carried steps, codes seed {CALIBRATION_SEED}"
             if r["dtype"] != "fp16" else "", "evaluation_codes_seed": CODES_SEED + 1} for r in fp16 + int8]


def sidecar_rows(main_path, first_path, tokens: int, event: int, window_event: int = 12,
                 left_context: int | None = None) -> list[dict]:
    """The sidecar over onnxruntime fp32: offline, 16+64 streaming and the window role against one
    full decode of the same codes (torch), and the window role against the package's chunked_decode."""
    import torch

    from ...runtime import OrtRunner
    from .model import full_decode
    from .producer import read_contract
    from .sidecar import LEFT_CONTEXT, VocoderSidecar, events

    left_context = LEFT_CONTEXT if left_context is None else left_context
    main_c, first_c = read_contract(main_path), read_contract(first_path)
    dec = decoder(main_c.params["widths"], main_c.params["seed"])
    codes = _codes(dec, tokens, CODES_SEED + 2)
    ref = full_decode(dec, codes)
    side = VocoderSidecar(OrtRunner(main_path), main_c, OrtRunner(first_path), first_c)
    rows = []

    def add(mode, pcm, reference, against, seconds, steps):
        rows.append({"mode": mode, "against": against, "tokens": tokens, "steps": steps,
                     "snr_db": gates.snr_db(reference, pcm), **heard(reference, pcm), "samples": int(pcm.size),
                     "seconds": round(seconds, 1), **FP32})

    t0 = time.monotonic()
    pcm = side.decode(codes)
    add("offline, main engine", pcm, ref, "full decode", time.monotonic() - t0, _fmt(side.steps))
    t0 = time.monotonic()
    pcm = np.concatenate(list(side.stream(events(codes, event))))
    add(f"streaming, events of {event}", pcm, ref, "full decode", time.monotonic() - t0, _fmt(side.steps))
    t0 = time.monotonic()
    pcm = np.concatenate(list(side.window_stream(events(codes, window_event), left_context)))
    seconds = time.monotonic() - t0
    with torch.no_grad():
        chunked = dec.chunked_decode(torch.as_tensor(codes), chunk_size=window_event,
                                     left_context_size=left_context).reshape(-1).numpy()
    n_events = -(-tokens // window_event)
    add(f"window role, events of {window_event}, left context {left_context}", pcm, chunked,
        "package chunked_decode", seconds, f"{main_c.params['codes_length']}x{n_events}")
    add(f"window role, events of {window_event}, left context {left_context}", pcm, ref, "full decode", seconds,
        f"{main_c.params['codes_length']}x{n_events}")
    return rows


def _fmt(steps) -> str:
    return " + ".join(f"{b}x{n}" for b, n in steps)


def uniform(rows: list[dict]) -> list[dict]:
    """Rows with one column set (the union, in first-seen order; "" where a row has none), which a
    committed table needs: the census mixes built, counted-only and not-exported settings."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k, "") for k in columns} for r in rows]


def quantization_stage(onnx_path, calibration_steps: int = 4, evaluation_steps: int = 3):
    """One step engine as rkstudy.levers.quantization sees it, on random codes (the weights are seeded random
    and no talker runs here, so any codes are as good as a talker's; the table says so): the
    calibration feeds are `calibration_steps` carried steps of the CALIBRATION_SEED stream, the
    evaluation items `evaluation_steps` carried steps of another stream (CODES_SEED + 1), each fed
    the cache onnxruntime fp32 carried into it, scored on audio per step and over the steps."""
    from pathlib import Path

    from ...levers.quantization.stages import Stage, span_scores
    from .producer import carried_feeds, read_contract

    n = read_contract(onnx_path).params["codes_length"]

    def walk(runner, feed):
        return runner.run(feed)[0]

    def score(items, refs, tests):
        return span_scores(refs, tests, [[(0, a.size)] for a in refs])

    # random weights: the audio is no speech (no DNSMOS), but PESQ-WB and STOI still say how far it moved
    return Stage(name=f"Qwen3 vocoder {n}-token step", onnx=Path(onnx_path), rate=SAMPLE_RATE, audio=lambda x: x,
                 speech=False,
                 calibration=carried_feeds(onnx_path, calibration_steps, seed=CALIBRATION_SEED),
                 evaluation=carried_feeds(onnx_path, evaluation_steps, seed=CODES_SEED + 1), walk=walk, score=score,
                 texts={"calibration": f"random codes, seed {CALIBRATION_SEED}",
                        "evaluation": f"random codes, seed {CODES_SEED + 1}"})
