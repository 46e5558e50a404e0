"""The component execution plan: which of a model's components run on the NPU, and with which engines.

One JSON object per model, as the RKNN decoder-path document's runtimes take it: its keys name the
model's components (Piper: duration_encoder, duration_flows, decoder; Kokoro: generator; Qwen3:
speech_decoder; Inflect v2: decoder; CosyVoice3: flow), each with `impl` (rknn, or the CPU path:
onnxruntime, or default), `backend`, `artifacts` (engines by role: main, and Qwen3's first and window;
a comma-separated ladder of per-width engines for the duration encoder and the flow) and `params`
(Kokoro's overlap and gain). `{}` is the CPU path throughout.

* schema.py: what a plan may say, per model, gathered from the families (`Family.plan`);
* validate.py: the plan read strictly, one line naming the key and the fix, and its artifacts found;
* engines.py: each engine checked against its contract, and opened on RKNNLite, the simulator or onnxruntime;
* speak.py: `rkstudy speak MODEL`, the whole synthesis under a plan, measured in a child, one row a run;
* audio.py: WAV and FLAC in and out through soundfile.

Board side: standard library and numpy (soundfile for audio files).
"""

from .schema import CPU, DEFAULT, NPU, Component, ModelPlan, Param, Role, schema, schemas  # noqa: F401
from .validate import Choice, Plan, PlanError, resolve, validate  # noqa: F401
