"""What the installed compiler says about one graph (host): build status, REGTASK lines, where every
layer landed (NPU or CPU, read from the verbose build log's layer table) and, when the graph builds,
the simulator against onnxruntime fp32 on the same input.

lint's rules predict; this module asks the real toolkit. The op-support probes
(rkstudy.lint.opsupport) and the lint-vs-compiler matrix (rkstudy.lint.against_toolkit) both use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ..toolkit.log import IO_OPS, Layer, layer_table

VERDICT_VERSION = 2  # bump when what a CompilerAnswer records changes (keys the verdict cache)
LAYOUT_OPS = ("Reshape", "Transpose")  # what the compiler inserts around 3-D tensors (its layouts are 4-D)


@dataclass
class CompilerAnswer:
    """The compiler's answer for one graph on one target."""

    target: str
    status: str                      # BuildReport.status: ok, failed, aborted, regtask-limit, timeout
    failed_step: str | None
    error: str
    regtask: int
    regtask_max: int
    layers: list[Layer] = field(default_factory=list)
    snr_db: float | None = None      # simulator vs onnxruntime fp32 (None: not built or not run)
    nonfinite: int = 0               # non-finite simulator output values where fp32 has none
    build_s: float = 0.0

    @property
    def built(self) -> bool:
        return self.status == "ok"

    @property
    def cpu_layers(self) -> list[Layer]:
        """Layers the compiler left on the CPU (graph inputs and outputs excluded)."""
        return [x for x in self.layers if x.target == "CPU" and x.op not in IO_OPS]

    def cpu_work(self, nodes: Sequence[str]) -> list[Layer]:
        """CPU layers that compute: the layout Reshape/Transpose layers the compiler inserts around
        3-D tensors are left out, unless they are named after one of the graph's `nodes`. Layers the
        compiler adds for an op (a ConvTranspose's `exConvTransposePad`, a Reciprocal's `Div`) count."""
        names = set(nodes)
        return [x for x in self.cpu_layers if x.op not in LAYOUT_OPS or x.node in names]

    def row(self) -> dict:
        return {"status": self.status, "failed_step": self.failed_step or "", "error": self.error,
                "regtask": self.regtask, "regtask_max_value": self.regtask_max,
                "cpu_layers": ",".join(f"{x.op}:{x.name}" for x in self.cpu_layers),
                "simulator_snr_db": float("nan") if self.snr_db is None else self.snr_db,
                "simulator_nonfinite": self.nonfinite, "build_s": round(self.build_s, 1)}


def _error_line(report) -> str:
    """The toolkit's own reason, one line: its `E ...` log lines beat the Python exception text."""
    from ..errors import one_line

    log = Path(report.log).read_text(encoding="utf-8", errors="replace") if report.log else ""
    lines = log.splitlines()
    said = [line[2:].strip() for line in lines if line.startswith("E ") and "Traceback" not in line
            and "rknn-toolkit2 version" not in line and line[2:].strip() not in ("build:", "load_onnx:")]
    reason = next((line for line in lines if "not support" in line or "Could not find" in line), "")
    if "Could not find" in reason:  # onnxruntime's own log line, inside the toolkit's fold_constant
        reason = "onnxruntime in fold_constant: " + reason[reason.index("Could not find"):]
    raised = next((line for line in lines if re.match(r"^\w+Error: \S", line) and "Traceback" not in line), "")
    fuse = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Rule: ")), "")
    if not reason and raised:
        reason = raised + (f" (in the toolkit's fuse rule {fuse})" if fuse else "")
    return one_line(reason or (said[0] if said else report.error or ""), 200)


def save(model: onnx.ModelProto, name: str) -> Path:
    """A probe graph in the cache, keyed by its bytes (a rerun reuses the file)."""
    from ..cache import cached_bytes

    return cached_bytes("lint", name, model.SerializeToString(), ".onnx")


def _key(path: Path, target: str, feeds, shapes) -> str:
    from ..cache import digest
    from ..tables.results import toolkit_version

    arrays = [(k, np.ascontiguousarray(v).tobytes()) for k, v in sorted((feeds or {}).items())]
    return digest(path, target, toolkit_version(), None if shapes is None else dict(shapes), arrays, VERDICT_VERSION)


def ask(model, target: str, feeds: Mapping[str, np.ndarray] | None = None, *,
        shapes: Mapping[str, Sequence[int]] | None = None, name: str = "probe", reuse: bool = True) -> CompilerAnswer:
    """Build `model` (a ModelProto or a path) for `target` in a verbose toolkit child and, when it
    builds and `feeds` are given, run the simulator on them against onnxruntime fp32
    (rkstudy.toolkit.convert.simulator_vs_fp32). `shapes={}` hands the toolkit no input shapes at all, which
    is how a dynamic graph reaches it unpinned.

    With `reuse`, a verdict already recorded for the same graph bytes, target, toolkit, shapes and
    inputs is read back from the cache instead of building again (the build is deterministic)."""
    import json
    from dataclasses import asdict

    from ..atomic import write_text
    from ..cache import cache_dir

    path = save(model, name) if isinstance(model, onnx.ModelProto) else Path(model)
    record = cache_dir("lint", "verdicts") / f"{name}-{_key(path, target, feeds, shapes)}.json"
    if reuse and record.is_file():
        saved = json.loads(record.read_text(encoding="utf-8"))
        saved["layers"] = [Layer(**x) for x in saved["layers"]]
        return CompilerAnswer(**saved)
    verdict = _ask(path, target, feeds, shapes)
    write_text(record, json.dumps(asdict(verdict)))
    return verdict


def _ask(path: Path, target: str, feeds, shapes) -> CompilerAnswer:
    """One verbose build through the shared engine cache (with `feeds`, in a simulator child whose outputs
    the cache keeps too), so a graph another study already built at the same key is not built again."""
    from ..toolkit.build import BuildFailed, build_engine
    from ..toolkit.convert import simulator_vs_fp32

    kwargs = {"verbose": True, **({"shapes": dict(shapes)} if shapes is not None else {})}
    snr = None
    nonfinite = 0
    if not feeds:
        report = build_engine(path, target, **kwargs)
    else:
        try:
            sim = simulator_vs_fp32(path, target, [dict(feeds)], keep=True, cache=True, **kwargs)
            report = sim.report
            snr = sim.rows[0]["snr_db"]
            fp32_bad = sum(int(np.sum(~np.isfinite(np.asarray(o, np.float64)))) for o in sim.fp32[0])
            sim_bad = sum(int(np.sum(~np.isfinite(np.asarray(o, np.float64)))) for o in sim.simulator[0])
            nonfinite = max(0, sim_bad - fp32_bad)
        except BuildFailed as exc:
            if exc.report is None:
                raise
            report = exc.report
    log = Path(report.log).read_text(encoding="utf-8", errors="replace") if report.log else ""
    return CompilerAnswer(target=target, status=report.status, failed_step=report.failed_step,
                   error="" if report.ok else _error_line(report), regtask=report.regtask,
                   regtask_max=report.regtask_max, layers=layer_table(log), snr_db=snr, nonfinite=nonfinite,
                   build_s=report.seconds)
