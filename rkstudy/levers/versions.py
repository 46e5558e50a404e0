"""The toolkit version as a lever (host): the same graphs built and simulated with every rknn-toolkit2
version this project has a converter environment for, side by side.

Why: the reference documents built with 2.3.2 and their boards run librknnrt 2.3.2, while this project
builds with 2.5.0. Where our build logs differ from theirs (REGTASK lines on the Piper 93-frame window,
the widest Kokoro window the 13-bit field allows), building the same bytes with both versions says
whether the version explains the difference. Each build runs in its version's own environment
(rkstudy.toolkit.envs.toolkit_env), and every row names the toolkit its build child imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import cache
from ..errors import NeedsConverter
from ..gates import board_risk
from ..paths import REPO
from ..tables.results import reference
from ..toolkit.build import BuildFailed
from ..toolkit.convert import simulator_vs_fp32
from ..toolkit.envs import Toolkit, toolkit_env

VERSIONS = ("2.5.0", "2.3.2")  # when pyproject.toml is not beside the code (an installed package)


def supported_versions() -> list[str]:
    """The versions [tool.rkstudy] toolkits in pyproject.toml lists (the default one first)."""
    path = REPO / "pyproject.toml"
    if not path.is_file():
        return list(VERSIONS)
    import tomllib

    return list(tomllib.loads(path.read_text())["tool"]["rkstudy"]["toolkits"])


def environments(versions: Sequence[str] | None = None) -> tuple[dict[str, Toolkit], dict[str, str]]:
    """({version: its environment} for the versions that have one here, {version: the one line that
    says how to make it} for those that do not)."""
    found, missing = {}, {}
    for version in versions or supported_versions():
        try:
            found[version] = toolkit_env(version)
        except NeedsConverter as exc:
            missing[version] = str(exc)
    return found, missing


@dataclass
class Engine:
    """One graph to build with each version: its name in the tables, its ONNX, the probe inputs
    the simulator is scored on against onnxruntime fp32, and the targets it is built for."""

    name: str
    onnx: Path
    feeds: list[Mapping[str, np.ndarray]]
    targets: tuple[str, ...]


def version_row(engine: Engine, target: str, version: str) -> dict:
    """Build `engine` for `target` with toolkit `version` in a simulator child, run its probe through
    the simulator and onnxruntime: the build row (status, REGTASK lines and largest value, bytes,
    seconds, converter peak) and the worst simulator SNR vs fp32. A build that fails is a row too."""
    out = cache.cache_dir("engines", "toolkit_versions") / f"{engine.onnx.stem}-{target}-{version}.rknn"
    try:
        sim = simulator_vs_fp32(engine.onnx, target, engine.feeds, out=out, toolkit=version)
        report, snr = sim.report, sim.worst_snr_db
        nonfinite = sum(int(v) for r in sim.rows for k, v in r.items() if k.endswith("_nonfinite"))
    except BuildFailed as exc:
        if exc.report is None:
            raise
        report, snr, nonfinite = exc.report, float("nan"), 0
    row = report.row()
    return {"engine": engine.name, "toolkit": report.toolkit_version.removeprefix("rknn-toolkit2 "),
            **{k: row[k] for k in ("status", "target", "dtype", "regtask", "regtask_max_value")},
            "engine_bytes": report.engine_bytes, "simulator_snr_db": round(snr, 2), "nonfinite": nonfinite,
            **{k: row[k] for k in ("build_s", "converter_peak_mb", "failed_step", "error")}, "where": "simulator",
            "built_with": report.toolkit_version}


def compare(engines: Sequence[Engine], versions: Sequence[str],
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """version_row for every engine, target and version (versions innermost, so the rows of one
    engine and target sit together)."""
    rows = []
    for engine in engines:
        for target in engine.targets:
            for version in versions:
                if progress:
                    progress(f"{engine.name}, {target}, rknn-toolkit2 {version}")
                rows.append(version_row(engine, target, version))
    return rows


def _reference_regtask(engine: str, target: str) -> str:
    """The reference documents' REGTASK count for the same engine and target (built with 2.3.2)."""
    figure = {"Piper decoder 93-frame window": ("piper_decoder", "REGTASK lines: Piper w93 engine")}.get(engine)
    if not figure:
        return ""
    return next((r["value"] for r in reference(figure[0]) if r["figure"] == figure[1] and r["target"] == target), "")


def side_by_side(rows: Sequence[Mapping], versions: Sequence[str]) -> list[dict]:
    """One row per engine and target, each version's REGTASK lines, largest value, bytes, SNR, status
    and board-risk verdict (rkstudy.gates.board_risk of that version's build) in its own column, the
    REGTASK difference, and the reference documents' count: no version's simulator SNR stands without
    what that version's compiler logged."""
    out = {}
    for r in rows:
        key = (r["engine"], r["target"])
        side = out.setdefault(key, {"engine": r["engine"], "target": r["target"], "where": "simulator"})
        v = r["toolkit"]
        side.update({f"status_{v}": r["status"], f"regtask_{v}": r["regtask"],
                     f"regtask_max_value_{v}": r["regtask_max_value"], f"engine_bytes_{v}": r["engine_bytes"],
                     f"simulator_snr_db_{v}": r["simulator_snr_db"], f"build_s_{v}": r["build_s"],
                     f"board_risk_{v}": r.get("board_risk") or board_risk(r)})
    for (engine, target), side in out.items():
        present = [v for v in versions if f"regtask_{v}" in side]
        if len(present) >= 2:
            first, other = present[:2]
            side[f"regtask_{other}_minus_{first}"] = side[f"regtask_{other}"] - side[f"regtask_{first}"]
            a, b = side[f"simulator_snr_db_{first}"], side[f"simulator_snr_db_{other}"]
            side[f"snr_db_{other}_minus_{first}"] = round(b - a, 2) if np.isfinite(a + b) else float("nan")
        side["reference_regtask"] = _reference_regtask(engine, target)
    return list(out.values())

