"""The headline numbers each study notebook recorded in quick mode, checked against the gates with
tolerances (recommenders' pattern: running is not enough, the numbers must hold).

The notebooks run under nbmake, as a user's CI would run them: `pytest --nbmake notebooks/` (the first
step of `make test`), each in quick mode as its `parameters` cell stands, writing its tables and
headlines to build/quick-results/ (never the committed results/). These checks read what that run
wrote; a study with no quick headlines, or headlines older than its notebook, fails and says to run the
notebooks first.
"""

import json
import math

import pytest

from rkstudy.paths import NOTEBOOKS, QUICK_RESULTS
from rkstudy.tables import results

pytestmark = pytest.mark.notebooks

# study -> notebook, and {headline: (low, high)} the quick run must land in (inclusive)
EXPECT = {
    "toolchain": ("00_toolchain.ipynb", {
        "simulator vs fp32 on the probe, rk3588": (40, math.inf),
        "simulator vs fp32 on the probe, rk3566": (40, math.inf),
        "REGTASK lines, Conv1d at 32768 frames, rk3588": (10, 1000),
        "REGTASK lines, Conv1d at 32768 frames, rk3566": (0, 0),
        "simulator vs fp32, worst over the sweep's clean engines": (40, math.inf),
        # how to read a perceptual score (quick: the `phone` sentence, 4.4 s): measured 2026-12-03 at PESQ-WB 4.642,
        # STOI 1.000, log-mel 0.09 dB (fp16); PESQ-WB 1.82 (int8); 1.52 and STOI 0.919 (white noise 20 and 10 dB);
        # DNSMOS OVRL 3.33 (fp32) and 2.21 (white noise 10 dB)
        "perceptual: PESQ-WB, fp16 engine vs fp32 (rk3588 simulator)": (4.4, 4.65),
        "perceptual: STOI, fp16 engine vs fp32 (rk3588 simulator)": (0.995, 1.0),
        "perceptual: log-mel distance, fp16 engine vs fp32 (rk3588 simulator)": (0.0, 0.5),
        "perceptual: PESQ-WB, int8 w8a8 engine vs fp32 (rk3588 simulator)": (1.04, 3.0),
        "perceptual: PESQ-WB, white noise 20 dB": (1.3, 1.8),
        "perceptual: STOI, white noise 10 dB": (0.85, 0.96),
        "perceptual: DNSMOS OVRL, fp32 reference": (2.8, 3.8),
        "perceptual: DNSMOS OVRL, white noise 10 dB": (1.7, 2.7)}),
    "piper_decoder": ("01_piper_decoder.ipynb", {
        "interior window SNR at 93 frames, worst (fp32)": (60, math.inf),
        "tail window 47 frames with the decoder mask (fp32)": (100, math.inf),
        "wrong seam: output RMS ratio": (0.1, 0.5),
        "simulator rk3588 vs full-length fp32 decode": (30, math.inf),
        "simulator rk3588: best lag": (0, 0),
        # what a listener would judge (quick: short and phone back to back); the fp16 engine is transparent
        "simulator rk3588 vs full-length fp32 decode: PESQ-WB": (4.3, 4.65),
        "simulator rk3588 vs full-length fp32 decode: STOI": (0.99, 1.0),
        "simulator rk3588 vs full-length fp32 decode: DNSMOS OVRL": (2.8, 3.8),
        # paroli's 45+5+5 walk: ~10 dB SNR on speech, PESQ-WB 3.83 on the phone sentence alone
        "window walk 55 frames vs full decode, every sentence: PESQ-WB (fp32)": (3.0, 4.4),
        "rk3588 engine, 93-frame window": (20.0, 22.5),
        "REGTASK lines, rk3588 93-frame engine": (18, 18),
        "CPU RTF, windowed / monolithic": (1.2, 5.0),
        "receptive field, frames left / right of a perturbed frame (max)": (20, 45),
        "minimum context for 80 dB on speech (emit 45)": (16, 32),
        # quick: "No." and "Hello." (46 and 49 frames), measured 2026-12-01 at under 0.001 dB
        "decoder mask on short utterances: largest |masked - unmasked| vs full decode (simulator rk3588)": (0, 0.1),
        # quick: the short and the phone text (two chunks, the second above the ladder {128}) through onnxruntime;
        # the window walk against the one-call decoder, and the ladder voicing the CPU plan's latent (measured
        # 2026-12-04 on the phone text alone: 89.1 dB, 0 frames)
        "speak: NPU decoder plan vs the CPU plan, global SNR (onnx)": (50, math.inf),
        "speak: encoder ladder plan, frames apart from the CPU plan (onnx)": (0, 0),
        "speak: chunks of the text": (2, 2)}),
    "piper_decoder_stateful": ("01b_piper_decoder_stateful.ipynb", {
        "lookahead": (10774, 10774),
        "state floats": (87707, 87707),
        "compute ratio, stateful step E=45": (0.9, 1.0),
        "compute ratio, window walk 93": (0.48, 0.49),
        "exactness float64, step vs full decode, worst (E=45)": (120, math.inf),
        "exactness fp32, step vs full decode, worst (E=45)": (90, math.inf),
        "stateful step vs full decode, PESQ-WB, worst (E=45, fp32)": (4.6, 4.65),
        "rk3588 engine, stateful step E=45": (20.0, 23.5),
        "REGTASK lines, rk3588 stateful step E=45": (1, 100)}),
    "inflect_decoder": ("01_piper_decoder.ipynb", {
        "context 32 at 480 frames (fp32)": (100, math.inf),
        "rk3588 engine, 256-frame window": (24.0, 27.0)}),
    "piper_encoder": ("02_piper_encoder.ipynb", {
        "raw slice nodes": (992, 992),
        "rewritten vs raw slice, worst (fp32)": (120, math.inf),
        "pad-safe, worst (fp32)": (120, math.inf),
        "simulator vs fp32, worst over widths": (50, math.inf),
        "rk3588 engine at width 64": (30, 36),
        "duration drift in the simulator, largest |%|": (0, 5.0),
        # the banded rewrite (quick: widths 64 and 128); research run: 15.3 and 16.4 MB, 62.2-62.3 dB
        "banded: rk3588 engine at width 128": (14.0, 20.0),
        "gather / banded engine bytes at width 64": (1.8, 2.6),
        "banded vs raw slice, worst (fp32)": (120, math.inf),
        "banded: max |diff| vs raw slice (fp32)": (0, 1e-5),
        "banded: simulator vs fp32, worst over widths": (50, math.inf),
        "banded minus gather: simulator worst at shared widths": (-3.0, 3.0),
        "banded: duration drift in the simulator, largest |%|": (0, 5.0)}),
    "qwen3_vocoder": ("04_qwen3_vocoder.ipynb", {  # quick mode: tiny widths, steps of 16 and 4 tokens
        "stepwise vs full decode, worst schedule": (120, math.inf),  # measured 132.7 (tiny), gate 40
        "cache hand-over alone (small step's cache into the main step)": (120, math.inf),
        "control: every step from a zeroed cache": (10, 40),  # measured 24.5: the gate sees the state
        # the same pair by PESQ-WB (random weights: noise, so no DNSMOS): measured 4.644 and 1.33
        "stepwise vs full decode, PESQ-WB, worst schedule": (4.6, 4.65),
        "control: every step from a zeroed cache, PESQ-WB": (1.04, 2.5),
        "cache floats, released config": (1298567, 1298567),
        "head dim, released config": (64, 64),
        "KV length, released config": (71, 71),
        "cache floats read back from the main step's graph": (6851, 6851),  # tiny widths
        "simulator vs fp32, main step, worst step, rk3588": (40, math.inf),  # measured 59.3
        "REGTASK lines, main step, rk3588": (0, 0),
        "engine size, main step, rk3588": (80, 115),  # measured 96.8 MB (tiny widths)
        "simulator vs fp32, first step, fp16, worst step, rk3588": (40, math.inf),  # measured 59.1
        # int8 w8a8 loses ~26 dB to fp16 on the same steps (measured 33.5; 32.7 at released widths, B=16)
        "simulator vs fp32, first step, int8 w8a8, worst step, rk3588": (25, 42),
        # the dynamo export (onnxscript in the models extra) writes opset 20: predicted, and load_onnx refuses it
        "census: exporter settings predicting an abort": (1, 1),
        "census: settings built / built ok": (0.75, 0.75),
        "census: builds the producer's prediction got right": (1, 1),
        "sidecar 16+64 streaming vs full decode": (120, math.inf),
        "window role vs the package's chunked_decode": (120, math.inf),
        # `rkstudy speak qwen3` (4+16 at toy widths, measured 2026-12-04: 107.7 and 67.6 dB): the stream with one
        # cache is the offline decode, the window role re-voices its context from zero and is not
        "speak: 16+64 streaming plan vs the CPU plan's offline decode (onnx)": (100, math.inf),
        "speak: window role vs the CPU plan's offline decode (onnx)": (40, 100)}),
    "flow_estimator": ("05_flow_estimator_memory.ipynb", {
        "consistency check (fed their costs and budget): their measured sets the model reproduces": (8, 8),
        "consistency check (fed their costs and budget): admit/refuse rows agreeing, with S>=900 sets":
            (17, 17),
        "consistency check (their costs): ladder walk, requests on the CPU path": (2, 2),
        # S=500 alone, under the reference's 3900 MiB budget
        "consistency check (their costs): ladder walk, most resident at once": (3752, 3752),
        "consistency check (fitted to their costs): S where the fit reaches their budget": (511, 513),
        "stand-in simulator vs fp32, worst": (40, math.inf),
        "stand-in engine at S=64, depth 2": (70, 85),
        "stand-in planned internal arena at S=64": (1.0, 2.5),
        "stand-in converter peak RSS, largest build": (200, 8000),
        "DRAM read on this host, 1 thread, wall clock (host, not a board)": (0.05, 200)}),
    "lint": ("06_lint.ipynb", {
        "rules registered": (15, 15),
        "rows disagreeing without a reason, rk3588": (0, 0),
        "op probes holding against the committed table (fraction)": (1, 1),
        "fp16: first node past 65504 = first q_inf layer (fraction)": (1, 1),
        "Piper encoder folded: relshift chains (first width)": (12, 12),
        "Piper encoder rewritten: error findings": (0, 0),
        "Piper decoder produced slice: exit code": (0, 0),
        "command exit codes as the API predicts (fraction)": (1, 1),
        "CPU nodes the compiler placed that lint predicted (fraction)": (1, 1),
        "CPU nodes lint predicted that the compiler kept on the NPU": (0, 0),
        "families linted": (6, 6),
        "flow estimator folded graph: error findings": (0, 0)}),
    "kokoro_generator": ("03_kokoro_generator.ipynb", {
        "dequantized generator vs the int8 ONNX at conv_post, short (fp32)": (40, 44),
        # by what a listener would judge (measured 2026-12-04): the int8 ONNX's audio is near transparent (PESQ-WB
        # 4.44 at 18.7 dB SNR); the per-window walk is another synthesis (PESQ-WB 1.95) that sounds as clean
        # (DNSMOS OVRL +0.04 against the full decode)
        "dequantized generator vs the int8 ONNX, audio, PESQ-WB (short, fp32)": (4.0, 4.6),
        "per-window walk vs full-length decode, PESQ-WB (fp32, no overlap, no gain)": (1.3, 2.8),
        "per-window walk minus full-length decode, DNSMOS OVRL (fp32, no overlap, no gain)": (-0.5, 0.5),
        "recovered modules vs the int8 graph, worst (fp32)": (120, math.inf),
        "padded window, worst (fp32)": (120, math.inf),
        "export gate, degree-5 sine (fp32)": (100, math.inf),
        "sine-level SNR, range-reduced degree 5": (40.5, 42.5),
        "sine-level SNR, clipped degree 5": (17, 19.5),
        "generator output vs exact sine, range-reduced degree 5 (fp32)": (45, 51),
        "Snake arguments past pi": (0.8, 1.4),
        "REGTASK lines, ups.0 ConvTranspose stride 10 probe": (8, 8),
        "REGTASK lines, ups.0 polyphase probe": (0, 0),
        "largest fp32 node at W = 128": (1000, 65504),
        "nodes past fp16 at W = 136": (0, 0),
        # over the audible windows: the short utterance's last window is its trailing silence, not counted
        # (4.33 dB over 3 of 4 windows, measured 2026-12-06 at f78bd17)
        "per-window loudness spread, no overlap, no gain (fp32)": (3, 7),
        "a latent of 72 frames in one window vs its full decode (fp32)": (110, math.inf),
        "global statistics fed, stitched vs full (fp32)": (120, math.inf),
        # the planner on the short utterance (220 frames): 8 frames each side with frozen statistics,
        # 151 frames (0.69 of the latent) as compiled (measured 2026-11-30, torch CPU)
        "receptive field, frozen statistics (planner, fp32)": (6, 11),
        "receptive field as compiled, share of the latent (planner, fp32)": (0.5, 1.0),
        # `rkstudy speak kokoro` on the short utterance (measured 2026-12-04: 3.9 dB, the same 220 frames): four
        # windows normalized each by their own statistics against the int8 model's one-call generator
        "speak: NPU generator plan vs the CPU plan, global SNR (onnx)": (0, 15),
        "speak: generator plan, frames apart from the CPU plan (onnx)": (0, 0)}),
    # quick mode: the real vocos (legacy export) and bigvgan (dynamo export) modules, a small HiFi-GAN V3 and
    # the instance-norm graph; the vocos step built for rk3588
    "port": ("07_port_your_model.ipynb", {
        "architectures ported (window and step)": (3, 3),
        "architectures refused a step, naming the node": (1, 1),
        "step vs full decode, float64, worst over every sample": (250, math.inf),
        "step vs full decode, float64, first 20 frames, worst": (250, math.inf),
        "step vs full decode, float64, last 20 frames, worst": (250, math.inf),
        "step vs full decode, fp32, worst at either end": (90, math.inf),
        "window walk, padded tail window, fp32, worst where the graph streams": (90, math.inf),
        "real vocos and bigvgan modules: step vs full decode, float64, worst at either end": (250, math.inf),
        "fp32 full decode vs float64, worst": (100, 160),
        "receptive field, vocos (legacy) (frames left, fp32)": (2, 12),
        "simulator rk3588 vs fp32 over the inputs, step, worst": (30, math.inf),
        "REGTASK lines, step, rk3588, most": (0, 0),
        "fp16 storage vs float64, worst graph (host)": (30, math.inf),
        # the 64-channel k=7 probe at 16384 frames (measured 2026-12-01: rk3576 14 lines against limit 0x3fff,
        # largest value 16384; rk3588 none) and the rv1106 refusal of an fp16 build
        "register field, rk3576 (64-ch probe, bits)": (14, 14),
        "REGTASK lines, 64-ch probe at 16384 frames, rk3576": (14, 14),
        "REGTASK lines, 64-ch probe at 16384 frames, rk3588": (0, 0),
        "targets refusing an fp16 build": (1, 1),
        # the real codec decoders (measured 2026-12-06: dac 24 kHz 308 dB float64, 131 dB against its own torch
        # decode, 8 samples short; lint's RK305 lines equal to the build's at 4 and 5 frames: 0 and 17,914)
        "dac 24 kHz decoder: step vs full decode, float64, worst at either end": (250, math.inf),
        "dac 24 kHz decoder: step vs the package's own decode, fp32": (100, math.inf),
        "dac 24 kHz decoder: samples past rate x frames, carried": (-8, -8),
        "snac decoders refused with their cause (noise, attention)": (2, 2),
        "lint RK305 predicted minus built REGTASK lines, dac 44.1 kHz windows, worst": (0, 0)}),
    # quick mode: the toolchain probe with both toolkit versions (`make test` makes the 2.3.2 environment)
    "toolkit_levers": ("08_toolkit_levers.ipynb", {
        "toolkit versions compared": (2, 2),
        "toolchain probe, rk3588, 2.5.0: simulator vs fp32": (40, math.inf),
        "toolchain probe, rk3566, 2.5.0: simulator vs fp32": (40, math.inf),
        "toolchain probe, rk3588, 2.3.2: simulator vs fp32": (40, math.inf),
        "toolchain probe, rk3566, 2.3.2: simulator vs fp32": (40, math.inf),
        "toolchain probe, rk3588, 2.5.0: REGTASK lines": (0, 0),
        "toolchain probe, rk3588, 2.3.2: REGTASK lines": (0, 0),
        "toolchain probe, rk3588, 2.5.0: engine": (20_000, 60_000),  # measured 31,785 bytes
        "toolchain probe, rk3588, 2.3.2: engine": (20_000, 60_000),  # measured 31,977 bytes
        # quantization, quick: the Piper window on rk3588, calibrated on the short text's window, scored on the
        # phone text's first 93 frames; measured 2026-12-04: fp16 45.1 dB and PESQ-WB 4.64, int8 w8a8 -2.0 dB and
        # PESQ-WB 2.19 at every conv MAC on 8-bit weights
        "quantization, Piper decoder 93-frame window rk3588, fp16: simulator vs fp32, worst window": (35, math.inf),
        "quantization, Piper decoder 93-frame window rk3588, fp16: PESQ-WB vs fp32": (4.5, 4.65),
        "quantization, Piper decoder 93-frame window rk3588, fp16: conv MACs on weights <= 8 bits": (0, 0),
        "quantization, Piper decoder 93-frame window rk3588, int8 w8a8: simulator vs fp32, worst window": (-5, 15),
        "quantization, Piper decoder 93-frame window rk3588, int8 w8a8: PESQ-WB vs fp32": (1.0, 3.0),
        "quantization, Piper decoder 93-frame window rk3588, int8 w8a8: conv MACs on weights <= 8 bits": (1, 1),
        "quantization: conv MACs the layer table accounts for, worst row": (1, 1),
        # the isolation (measured 2026-12-04): every layer accuracy_analysis names in fp16 leaves the compiler's
        # tiles, 9.9 % of the conv MACs, in int8 at 9.0 dB; with them in fp16 too, fp16's 45.1 dB
        "quantization isolation, Piper decoder 93-frame window, the ranked layers: conv MACs on weights <= 8 bits":
            (0.09, 0.11),
        "quantization isolation, Piper decoder 93-frame window, the ranked layers: simulator worst window": (0, 25),
        "quantization isolation, Piper decoder 93-frame window, + compiler-made: simulator worst window":
            (35, math.inf),
        "quantization isolation, Piper decoder 93-frame window, + compiler-made: conv MACs on weights <= 8 bits":
            (0, 0),
        # multi-shape, quick: the conv stack at T = 16 and 32; measured 2026-12-01: one engine of 240,805 B
        # against two of 203,301 B (0.59), 64.23 dB at its worst width, as the single engines
        "multi-shape, conv stack (C=64, 4 layers): built": (1, 1),
        "multi-shape, conv stack (C=64, 4 layers): engine bytes against the single engines together": (0.4, 0.8),
        "multi-shape, conv stack (C=64, 4 layers): worst-width SNR minus the single engines'": (-1, 1),
        # the int16 section's quick stand-in: the Kokoro raw-sum W = 128 graph on the short utterance's
        # window, fp32 (measured 2026-12-01: 3 of 1,750 nodes past fp16, the largest 624,654)
        "Kokoro raw-sum W = 128: nodes past fp16 (fp32)": (1, 20)}),
    # quick mode: the Piper 93-frame window alone (2.3.2, rk3588) under the committed constants; measured 2026-12-06:
    # the compiler's table (233 compute layers, 8.3 M cycles, 87.2 MB a call) is the same bytes on every host; the
    # prediction, 26.9 ms (8.2 conv, 8.6 waiting for bytes, 9.6 elementwise), 0.643 ms per emitted slice against the
    # board's 0.46; the dec mask's cost is the quick run's one held-out figure
    "npu_cost": ("09_npu_cost.ipynb", {
        "Piper window: compute layers": (233, 233), "Piper window: cycles (M)": (8.3, 8.3),
        "Piper window: MB per call": (87.2, 87.2), "Piper window: cost-model NPU ms per call": (20, 35),
        "Piper: cost-model ms per emitted slice": (0.45, 0.85), "held-out figures predicted": (1, 1),
        "constant: dram_share": (0.12, 0.14)}),
}


STUDIES = {nb: [s for s, (n, _) in EXPECT.items() if n == nb] for nb, _ in EXPECT.values()}
RUN_FIRST = "run the notebooks first: `pytest --nbmake notebooks/` (the first step of `make test`)"


@pytest.mark.parametrize("notebook", sorted(STUDIES))
def test_notebook_headlines(notebook):
    outside = []
    for study in STUDIES[notebook]:
        path = QUICK_RESULTS / study / "headlines.json"
        assert path.is_file(), f"{study}: no quick-mode headlines in {path.parent}; {RUN_FIRST}"
        assert path.stat().st_mtime >= (NOTEBOOKS / notebook).stat().st_mtime, \
            f"{study}: the quick-mode headlines are older than {notebook}; {RUN_FIRST}"
        recorded = results.read_headlines(study, QUICK_RESULTS)["headlines"]
        for name, (low, high) in EXPECT[study][1].items():
            if name not in recorded:
                outside.append(f"{study}: {name} was not recorded")
                continue
            value = float(recorded[name]["value"])
            if not low <= value <= high:
                outside.append(f"{study}: {name} = {value}, expected in [{low}, {high}]")
    assert not outside, "\n".join(outside)


def test_every_notebook_is_checked():
    assert sorted({nb for nb, _ in EXPECT.values()}) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def test_notebooks_name_the_project_kernel_a_cell_timeout_and_a_parameters_cell():
    """What `pytest --nbmake notebooks/` needs from each notebook with no flags: the project's kernel,
    and a cell timeout of its own (nbmake's default, 300 s, is shorter than a quick Kokoro build)."""
    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = json.loads(path.read_text())
        assert nb["metadata"]["kernelspec"]["name"] == "rkstudy", path.name
        assert nb["metadata"].get("execution", {}).get("timeout", 0) >= 1800, path.name
        tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and "QUICK = True" in "".join(tagged[0]["source"]), path.name


def test_executed_notebooks_stay_readable_on_a_code_host():
    """`make reproduce` keeps the executed notebooks under results/notebooks/: at most 3 MB each, and
    every embedded audio clip at most 5 s (the full renders go to the cache)."""
    import base64
    import io
    import wave

    from rkstudy.paths import RESULTS

    for path in sorted((RESULTS / "notebooks").glob("*.ipynb")):
        assert path.stat().st_size <= 3_000_000, f"{path.name} is {path.stat().st_size / 1e6:.1f} MB"
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            for out in cell.get("outputs", []):
                html = out.get("data", {}).get("text/html", "")
                html = "".join(html) if isinstance(html, list) else html
                for b64 in html.split('base64,')[1:]:
                    data = base64.b64decode(b64.split('"')[0])
                    with wave.open(io.BytesIO(data)) as w:
                        assert w.getnframes() / w.getframerate() <= 5.0 + 1e-6, path.name
