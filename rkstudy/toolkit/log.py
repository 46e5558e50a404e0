"""What rknn-toolkit2 prints, read once: ANSI colour, REGTASK lines, the layer table, the memory plan
and the accuracy-analysis report.

The compiler is C++ and writes to the process's fds (rkstudy.toolkit.build reads them); a verbose build adds
the "Network Layer Information Table", one row per compiled layer:

    D RKNN: [20:08:25.162] 2    Sin                FLOAT16  CPU    (1,8,1,30)  (1,8,1,30)  0/0/0  0  Sin:/act/Sin

(ID, OpType, DataType, Target, shapes, cycles, RW, FullName = `OpType:node`). Every reader of that
table (lint's compiler verdicts, the Kokoro and flow-estimator builds, the NPU cost model) uses
`layer_table`, so one log gives every caller the same layers. rknn-toolkit2 2.3.2 prints the same columns.
numpy is imported only by the accuracy-analysis reader.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
REGTASK_VALUE = re.compile(r"value: 0x([0-9a-fA-F]+)")
REGTASK_LIMIT = re.compile(r"limit: 0x([0-9a-fA-F]+)")
IO_OPS = ("InputOperator", "OutputOperator")  # the table's I/O rows: CPU by definition, never a layer's work
_ROW = re.compile(r"^[DI] RKNN: \[[^\]]+\]\s+(?P<id>\d+)\s+(?P<op>\S+)\s+(?P<dtype>\S+)\s+(?P<target>CPU|NPU|GPU)\s"
                  r"(?P<rest>.*)\s(?P<full>\S+)\s*$")
_CYCLES = re.compile(r"^(\d+)/(\d+)/(\d+)$")  # Cycles(DDR/NPU/Total), the compiler's own estimate per layer
_CONST = re.compile(r"^[DI] RKNN: \[[^\]]+\]\s+(?P<id>\d+)\s+(?P<user>\S+)\s+(?P<tensor>\S+)\s+(?P<dtype>[A-Z]+\d*)\s+"
                    r"\((?P<shape>[0-9,]*)\)\s+\|")
_PLAN = re.compile(r"Total (Internal|Weight) Memory Size:\s*([0-9.]+)\s*(KB|MB|B)\b")
_PLAN_UNIT = {"B": 1, "KB": 1024, "MB": 1024 * 1024}
_ACCURACY_ROW = re.compile(r"^\[(?P<op>[^\]]+)\]\s+(?P<layer>\S+)\s+(?P<ec>\S+)\s*\|\s*(?P<ee>\S+)\s+"
                           r"(?P<sc>\S+)\s*\|\s*(?P<se>\S+)\s*$")
_OUT_OF_FP16 = re.compile(r"The range \[(?P<lo>[^,]+), (?P<hi>[^\]]+)\] of '(?P<name>[^']+)' is out of the float16")


def strip_ansi(text: str) -> str:
    """`text` without the colour escapes the toolkit wraps its warnings in."""
    return ANSI.sub("", text)


# --- REGTASK lines ----------------------------------------------------------------------------------
def is_regtask(line: str) -> bool:
    """A REGTASK line: the compiler's "bit width of field value exceeds" warning for one register."""
    return "REGTASK" in line


def regtask_value(line: str) -> int | None:
    """The field value a REGTASK line reports (`value: 0x45ff`), or None when it names none."""
    m = REGTASK_VALUE.search(line)
    return int(m.group(1), 16) if m else None


# --- the layer table --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """One row of the compiler's "Network Layer Information Table" (verbose builds only).
    `name` is the ONNX node name after the table's `OpType:` prefix; `dtype` is what the layer
    computes in (INT8, FLOAT16, INT16: a hybrid engine mixes them); `inputs` and `output` are the
    table's shape columns as printed ('(1,16,1,64),(16,16,1,7),(16)': data, weight, bias)."""

    id: int
    op: str
    target: str
    name: str
    dtype: str = ""
    inputs: str = ""
    output: str = ""
    # The compiler's Cycles(DDR/NPU/Total) and RW(KB) columns: its estimate of the cycles the layer spends on
    # memory traffic and on compute (Total is the larger of the two), and the KiB it reads and writes. None
    # where the row printed no such columns (a table cut from another tool's output); 0/0/0 is printed for
    # elementwise layers (their cost is their bytes) and for CPU layers.
    ddr_cycles: int | None = None
    npu_cycles: int | None = None
    cycles: int | None = None
    rw_kb: int | None = None

    @property
    def rw_bytes(self) -> int | None:
        """What the layer reads and writes, in bytes (the table's KB are KiB, as the memory plan's are)."""
        return None if self.rw_kb is None else self.rw_kb * 1024

    @property
    def node(self) -> str:
        """The ONNX node (or tensor) the layer is named after: the compiler appends `#k` to split layers."""
        return self.name.split("#", 1)[0]


def field_limits(log_text: str) -> list[int]:
    """The register-field limits the REGTASK lines of a build log name (`limit: 0x1fff`), distinct,
    ascending: the field width the compiler enforces on this target."""
    return sorted({int(h, 16) for h in REGTASK_LIMIT.findall(log_text)})


def layer_table(log_text: str) -> list[Layer]:
    """The layer table of a verbose build log, I/O rows included (empty when the build printed none)."""
    layers = []
    for line in strip_ansi(log_text).splitlines():
        m = _ROW.match(line)
        if m:
            full = m["full"]
            shapes = m["rest"].split()  # InputShape OutputShape Cycles RW
            layers.append(Layer(int(m["id"]), m["op"], m["target"], full.split(":", 1)[1] if ":" in full else full,
                                m["dtype"], *(shapes[:2] + ["", ""])[:2], **_costs(shapes[2:])))
    return layers


def _costs(columns: list[str]) -> dict:
    """The Cycles(DDR/NPU/Total) and RW(KB) columns of a row, where it printed them."""
    m = _CYCLES.match(columns[0]) if columns else None
    if not m or len(columns) < 2 or not columns[1].isdigit():
        return {}
    return {"ddr_cycles": int(m[1]), "npu_cycles": int(m[2]), "cycles": int(m[3]), "rw_kb": int(columns[1])}


WEIGHT_BITS = {"INT4": 4, "INT8": 8, "UINT8": 8, "INT16": 16, "FLOAT16": 16, "FLOAT": 32}


def weight_dtypes(log_text: str) -> dict[int, str]:
    """{layer id: the dtype its weight is stored in} from a verbose build's "Const Tensor Information
    Table" (INT8, INT4, FLOAT16 ...): a layer's weight is its first constant of two or more dimensions.
    Why this table: the layer table's dtype is what a layer computes in, which under w4a16 (4-bit
    weights, float16 activations) says FLOAT16 for a layer whose weights are 4-bit; the constants say
    what its weights are. Empty when the build printed no such table."""
    out: dict[int, str] = {}
    inside = False
    for line in strip_ansi(log_text).splitlines():
        if "Const Tensor Information Table" in line:
            inside, out = True, {}  # the last table printed is the engine's (a hybrid prints one per build)
            continue
        m = _CONST.match(line) if inside else None
        if m and len([d for d in m["shape"].split(",") if d]) >= 2:
            out.setdefault(int(m["id"]), m["dtype"])
    return out


def op_targets(layers: Iterable[Layer]) -> Counter:
    """{(op type, CPU | NPU): count} of the layers that compute (the I/O rows left out)."""
    return Counter((x.op, x.target) for x in layers if x.op not in IO_OPS)


def cpu_ops(layers: Iterable[Layer]) -> str:
    """The ops an engine leaves on the CPU, as 'Op:count ...' (empty when none)."""
    return " ".join(f"{op}:{n}" for (op, where), n in sorted(op_targets(layers).items()) if where == "CPU")


# --- the memory plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryPlan:
    """The compiler's plan for the two buffers a context maps, in bytes (its KB are KiB: it prints
    1626.38KB for 1665413 B). Whether librknnrt's RKNN_QUERY_MEM_SIZE on a board reports the same
    is one `rkstudy board memory` call away, and not measured here."""

    internal_bytes: int
    weight_bytes: int


def memory_plan(log_text: str) -> MemoryPlan | None:
    """The plan a verbose build log prints (rknn-toolkit2 2.5.0's RKNNMemStatisticsPass), or None."""
    found = {kind: int(round(float(value) * _PLAN_UNIT[unit])) for kind, value, unit in _PLAN.findall(log_text)}
    if "Internal" not in found or "Weight" not in found:
        return None
    return MemoryPlan(found["Internal"], found["Weight"])


def memory_plans(log_text: str) -> list[MemoryPlan]:
    """Every plan the log prints, in order: a multi-shape build (config's dynamic_input) prints one per
    input shape set, in the order of its sets."""
    plans, internal = [], None
    for kind, value, unit in _PLAN.findall(log_text):
        size = int(round(float(value) * _PLAN_UNIT[unit]))
        if kind == "Internal":
            internal = size
        elif internal is not None:
            plans.append(MemoryPlan(internal, size))
            internal = None
    return plans


# --- the accuracy-analysis report -------------------------------------------------------------------
def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")  # q_inf: the toolkit's mark for a layer whose range left fp16


def _snapshot_max(folder: Path, files: dict[str, str], layer: str) -> tuple[float, int]:
    import numpy as np

    path = folder / "npy" / (Path(files.get(layer, layer)).stem + ".npy")
    if not path.is_file():
        return float("nan"), 0
    x = np.load(path).astype(np.float64)
    finite = x[np.isfinite(x)]
    return (float(np.max(np.abs(finite))) if finite.size else float("nan")), int(x.size - finite.size)


def parse_accuracy_analysis(snapshot: Path, log_text: str = "") -> list[dict]:
    """Rows of the toolkit's error_analysis.txt, with each layer's max |x| (golden fp32 and simulator
    fp16, from the snapshot's npy files), its non-finite count and whether the build log warned that
    its range is out of fp16."""
    snapshot = Path(snapshot)
    files = {}
    mapping = snapshot / "map_name_to_file.txt"
    if mapping.is_file():
        for line in mapping.read_text(encoding="utf-8", errors="replace").splitlines()[2:]:
            parts = line.split()
            if len(parts) == 2:
                files[parts[0]] = parts[1]
    warned = {m["name"] for m in _OUT_OF_FP16.finditer(strip_ansi(log_text))}
    rows = []
    for line in (snapshot / "error_analysis.txt").read_text(encoding="utf-8", errors="replace").splitlines():
        m = _ACCURACY_ROW.match(strip_ansi(line).strip())
        if not m:
            continue
        golden, _ = _snapshot_max(snapshot / "golden", files, m["layer"])
        sim, nonfinite = _snapshot_max(snapshot / "simulator", files, m["layer"])
        values = [m[k] for k in ("ec", "ee", "sc", "se")]
        rows.append({"layer": m["layer"], "op": m["op"], "entire_cos": _number(values[0]),
                     "entire_euc": _number(values[1]), "single_cos": _number(values[2]),
                     "single_euc": _number(values[3]), "overflow": any(v == "q_inf" for v in values),
                     "range_warned": m["layer"] in warned, "golden_max_abs": golden,
                     "simulator_max_abs": sim, "simulator_nonfinite": nonfinite})
    return rows
