"""The model families: one folder per family, each registered once in rkstudy.registry.

A family folder wires the shared pieces and adds only what is its own, in the same section order
everywhere: seam and front end → producer (host) → sidecar (board side) → study (host measurements)
→ cli (its `rkstudy <model> <stage>` command) → board (its `rkstudy board run <family>` job). Its
`__init__.py` registers it, importing nothing heavy, so the command line, `rkstudy doctor` and the
board side can list every family on a board that has no converter.

Adding a family: its folder, and one line in FAMILIES below.

Board side: standard library only.
"""

from __future__ import annotations

from ..registry import REGISTRY, Family, get, hooked, load_all, register  # noqa: F401  (a family's own imports)

# The one registry line per family: the packages under rkstudy/families/ that register themselves.
FAMILIES = ("toolchain", "piper_decoder", "piper_decoder_stateful", "piper_encoder", "inflect_decoder",
            "kokoro_generator", "qwen3_vocoder", "flow_estimator", "port")

# Help for the first word of a family command (`rkstudy piper ...`).
GROUPS = {"piper": "Piper (VITS) voice stages", "inflect": "Inflect v2 decode.onnx contract",
          "kokoro": "Kokoro-82M (iSTFTNet) stages",
          "qwen3": "Qwen3-TTS stages (the 12 Hz vocoder with seeded random weights: the checkpoint is not obtainable)",
          "cosyvoice3": "CosyVoice3 stages (a DiT stand-in with random weights where the model is not obtainable)",
          "port": "your own conv vocoder ONNX: lint, fold, window plan, stateful step, build"}
