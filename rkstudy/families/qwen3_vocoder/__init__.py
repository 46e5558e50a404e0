"""The Qwen3-TTS 12 Hz speech-tokenizer decoder (the vocoder: codes -> 24 kHz PCM) as one stateful
streaming step: the causal-conv tails and the sliding-window attention KV history travel through
graph I/O as one flat fp32 cache, so a step continues from state and there are no seams.

The checkpoint is not obtainable here: the architecture is qwen-tts 0.1.1's own decoder module
(loaded without the package's __init__), at the released model's configuration values, with seeded
random weights. Every gate of the study is structural (it holds for any weights), and no number
from it is an audio-quality figure.

model.py (host: the package's decoder, the released config, seeded weights) · step.py (host: the streaming
step and its cache layout) · producer.py (stage 1: the step, made to compile without REGTASK lines by
rkstudy.graph.longaxis; the contract, the export census) · sidecar.py (board side: offline, 16+64 streaming
and the window role over rkstudy.walk.stateful) · study.py (host measurements, notebook 04) · lint_graphs.py
(lint study graphs) · levers.py (lever, compiler-check and NPU-cost graphs) · cli.py (`rkstudy qwen3 vocoder`) ·
board.py (`rkstudy board run qwen3_vocoder`) · speak.py (the Qwen3 plan and `rkstudy speak qwen3`: codes
through the speech decoder, offline or streaming, on the NPU roles main, first and window or the CPU)."""

from .. import Family, register

# torchscript17: the TorchScript exporter at opset 17 (the toolkit era's); dynamo: torch.onnx's default
# exporter (needs onnxscript). Census-only settings: the token axis left dynamic (shape plumbing),
# opset 14 (LayerNormalization spelt out), the package's SnakeBeta (exp(alpha) in the graph).
EXPORTERS = ("torchscript17", "dynamo", "torchscript17_dynamic", "torchscript14", "torchscript17_pkgsnake")
WIDTHS = ("released", "tiny")  # tiny: the released architecture at toy widths, for tests

FAMILY = register(Family(
    name="qwen3_vocoder",
    title="Qwen3-TTS 12 Hz vocoder (seeded random weights) as one stateful streaming step: one flat cache through "
          "graph I/O, 16+64 streaming",
    notebook="04_qwen3_vocoder.ipynb", command=("qwen3", "vocoder"),
    makes="rkstudy qwen3 vocoder --codes-length 64 --output qwen3_vocoder_b64.onnx --target {target}",
    cli="rkstudy.families.qwen3_vocoder.cli:add_cli",
    board="rkstudy.families.qwen3_vocoder.board:add_board",
    bundle="rkstudy.families.qwen3_vocoder.board:bundle_part",
    requires=("qwen_tts", "transformers"),
    lint_graphs="rkstudy.families.qwen3_vocoder.lint_graphs:lint_graphs",
    lever_graphs="rkstudy.families.qwen3_vocoder.levers:lever_graphs",
    npu_cost_cases="rkstudy.families.qwen3_vocoder.levers:npu_cost_cases",
    plan="rkstudy.families.qwen3_vocoder.speak:plan"))
