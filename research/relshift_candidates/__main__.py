"""The relative-shift candidates: the layouts tried before choosing the banded form (research, not a study).

From the repository root:

    python -m research.relshift_candidates candidates   # every layout in forms.py, built + simulated
    python -m research.relshift_candidates widths       # relshift mode="banded" at 64..512
    python -m research.relshift_candidates tables       # the tables from the saved rows

`candidates`: every formulation in forms.py (plus relshift's gather form at the widths
where its build is cheap) on the real encoder, built and simulated for rk3588.
`widths`: the shipped rewrite (relshift mode="banded") at 64..512: fp32 exactness/pad-safety
rows, then build + simulator per width.
`tables`: build/relshift_candidates/results/*.csv and *.md from the saved rows. They stay there:
no committed table comes from this script (its rows are not stamped by a study run).

Each build runs in a fresh `measure.py` process, one at a time (the machine is shared);
its row is saved under build/relshift_candidates/rows/ and reused on a rerun unless --force.
Notebook 02 measures the shipped form itself; this script is how the form was chosen.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from rkstudy.families.piper import voice as piper
from rkstudy.graph import relshift
from rkstudy.paths import RESULTS as REPO_RESULTS
from rkstudy.tables.results import read_table

from . import forms as candidates
from . import host as study

ROWS = study.OUT / "rows"
RESULTS = study.OUT / "results"
MAIN_SIZES = REPO_RESULTS / "piper_encoder" / "sizes.csv"  # the gather rows not rebuilt here
GATHER_MAX_WIDTH = 192  # the gather form is not rebuilt above this (6.8 GB at 256, 12.4 GB at 320)
WIDTHS = (64, 96, 128, 192, 256, 320, 384, 512)
# logits form + values form (candidates.split); `gather` is relshift's rewrite, `floor` zeroes both terms
FORMS = ("gather", "floor", "kfirst+stack4", "kconv+stack4", "kconv2+stack4", "stack4+stack4", "kfirst+stack",
         "kfirst", "stack", "bmm", "kfirst+bmm", "masks+stack", "masks+kfirst", "masks+sum", "masks", "mm+stack")
SLOW = ("masks+stack", "masks+kfirst", "masks+sum", "masks", "mm+stack")  # 3-10x the build time at 128, or failed
PLAN = {  # width -> candidates built there
    64: ("gather",), 96: ("gather",), 192: ("gather",),
    128: FORMS,
    256: tuple(f for f in FORMS if f not in SLOW and f != "gather"),
    512: ("floor", "kfirst+stack4", "kconv+stack4", "kconv2+stack4", "kfirst+stack", "kfirst+bmm"),
}


def _measure(onnx_path: Path, key: str, width: int, voice, force: bool, refs: Path | None = None,
             simulate: bool = True, verbose: bool = False) -> dict:
    out = ROWS / f"{key}.json"
    if out.exists() and not force:
        return json.loads(out.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(study.HERE / "measure.py"), str(onnx_path), str(out)]
    if simulate:
        cmd += ["--refs", str(refs or study.references(voice, width))]
    if verbose:
        cmd += ["--verbose"]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not out.exists():
        raise RuntimeError(f"measure.py failed for {key} (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    row = json.loads(out.read_text())
    row["wall_s"] = round(time.monotonic() - t, 1)
    out.write_text(json.dumps(row, indent=1))
    return row


def _product(voice, form: str, width: int) -> tuple[Path, list[dict]]:
    """Write the rewritten encoder for (form, width) and its fp32 rows (exactness, pad safety)."""
    path = study.OUT / "onnx" / f"enc_{form}_L{width}.onnx"
    rows_path = ROWS / f"fp32_{form}_L{width}.json"
    if path.exists() and rows_path.exists():
        return path, json.loads(rows_path.read_text())
    fold = study.folded(voice, width)
    model = relshift.rewrite_relshift(fold, mode="banded") if form == "banded" else candidates.make(form, fold)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    rows = study.fp32_rows(voice, width, fold, model)
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    rows_path.write_text(json.dumps(rows, indent=1))
    return path, rows


def run(voice, plan: dict, force: bool, verbose: bool, census: bool = False) -> None:
    """Build (and simulate) every (width, form) of `plan`, one fresh measure.py process each.
    verbose: the toolkit's verbose log (CPU-op census in the row; its converter peak includes
    the verbose logging). census: after each quiet build, one more verbose build without the
    simulator, only for the CPU-op census (row ops_<form>_L<width>)."""
    for width, forms in sorted(plan.items()):
        for form in forms:
            if form == "gather" and width > GATHER_MAX_WIDTH:
                raise SystemExit(f"not rebuilding the gather form at {width} (> {GATHER_MAX_WIDTH}): "
                                 "its converter peak is 6.8-12.4 GB there; its rows come from main's sizes.csv")
            path, fp32 = _product(voice, form, width)
            worst = min(r["worst_snr_db"] for r in fp32)
            print(f"{form} L={width}: fp32 worst {worst:.1f} dB, building ...", flush=True)
            row = _measure(path, f"{form}_L{width}", width, voice, force, verbose=verbose)
            print(f"  {row['status']} engine {row['engine_bytes']} B, {row['build_s']} s, build peak "
                  f"{row['build_peak_rss_bytes'] / 2**30:.2f} GiB, regtask {row['regtask']}, "
                  f"sim {row['sim_min_snr_db']}", flush=True)
            if census:
                ops = _measure(path, f"ops_{form}_L{width}", width, voice, force, simulate=False, verbose=True)
                print(f"  CPU ops: {ops['cpu_ops']}", flush=True)


def many_counts(width: int) -> list[int]:
    """Token counts spread over the width (every width/8 from 9), plus N-1 and N."""
    return sorted(set(range(9, width + 1, max(1, width // 8))) | {width - 1, width})


def simcompare(voice, widths, force: bool) -> None:
    """gather vs the shipped banded rewrite in the simulator at many token counts per width: is
    the per-count SNR difference systematic, or fp16 ordering noise around zero?"""
    for width in widths:
        refs = study.references(voice, width, many_counts(width), tag="_many")
        for form in ("gather", "banded"):
            path, _ = _product(voice, form, width)
            row = _measure(path, f"many_{form}_L{width}", width, voice, force, refs=refs)
            print(f"{form} L={width}: sim min {row['sim_min_snr_db']:.2f} dB over {len(row['sim'])} counts", flush=True)


# --- tables --------------------------------------------------------------------------------------
def _gb(b) -> float | str:
    return round(b / 2**30, 2) if b else ""


def _row(form: str, width: int) -> dict | None:
    m, f = ROWS / f"{form}_L{width}.json", ROWS / f"fp32_{form}_L{width}.json"
    if not m.exists():
        return None
    r = json.loads(m.read_text())
    fp = json.loads(f.read_text()) if f.exists() else []
    onnx_path = study.OUT / "onnx" / f"enc_{form}_L{width}.onnx"
    return {"candidate": form, "L": width, "status": r["status"], "engine_bytes": r["engine_bytes"],
            "build_s": r["build_s"], "build_cpu_s": r.get("build_cpu_s", ""),
            "load_1min": r.get("load_1min_at_start", ""), "converter_peak_rss_gib": _gb(r["build_peak_rss_bytes"]),
            "child_maxrss_gib": _gb(r["child_maxrss_bytes"]), "regtask": r["regtask"],
            "cpu_ops": r.get("cpu_ops") or "", "verbose_build": r.get("cpu_ops") is not None,
            "sim_min_snr_db": round(r["sim_min_snr_db"], 2) if r["sim_min_snr_db"] is not None else "",
            "sim_counts": ",".join(str(s["tokens"]) for s in r["sim"]),
            "fp32_worst_snr_db": round(min(x["worst_snr_db"] for x in fp), 2) if fp else "",
            "fp32_worst_max_diff": max(x["worst_max_diff"] for x in fp) if fp else "",
            "exact": all(x["exact"] for x in fp) if fp else "",
            "onnx_bytes": onnx_path.stat().st_size if onnx_path.exists() else "", "source": "measured here"}


def _main_gather_rows() -> list[dict]:
    """relshift's gather rows at the widths it is not rebuilt at (from the repository's sizes.csv)."""
    widths = [int(r["frames"]) for r in (read_table(MAIN_SIZES) if MAIN_SIZES.is_file() else [])
              if r.get("relshift", "gather") == "gather" and int(r["frames"]) > GATHER_MAX_WIDTH]
    return [{"candidate": "gather", "L": r["frames"], "status": r["status"], "engine_bytes": r["engine_bytes"],
             "build_s": r["build_s"], "build_cpu_s": "", "load_1min": "",
             "converter_peak_rss_gib": round(r["converter_peak_mb"] / 1024, 2),
             "child_maxrss_gib": "", "regtask": r["regtask"], "cpu_ops": "", "verbose_build": False,
             "sim_min_snr_db": "", "sim_counts": "", "fp32_worst_snr_db": "", "fp32_worst_max_diff": "",
             "exact": "", "onnx_bytes": "", "source": "results/piper_encoder/sizes.csv (not rebuilt)"}
            for r in _committed_gather_rows(widths)]


def _committed_gather_rows(widths) -> list[dict]:
    """The gather rows of the repository's sizes.csv at `widths`, numbers parsed (empty when the study
    has not written that table)."""
    if not MAIN_SIZES.is_file():
        return []
    return [{**r, "converter_peak_mb": float(r["converter_peak_mb"] or 0)} for r in read_table(MAIN_SIZES)
            if r.get("relshift", "gather") == "gather" and int(r["frames"]) in widths]


def _write(name: str, rows: list[dict], title: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not rows:
        return
    keys = list(rows[0])
    with open(RESULTS / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# {title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


VOICE_FP16_WEIGHT_BYTES = 13063446  # main results/piper_encoder/growth.md base_bytes (the voice's own weights)


def growth(rows: list[dict], key: str = "engine_bytes", base: float = 0.0) -> float:
    """Least-squares slope of log(key - base) against log(L): bytes - base ~ L^k."""
    pts = [(r["L"], r[key] - base) for r in rows if r.get(key) and r[key] > base]
    if len(pts) < 2:
        return float("nan")
    return float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])


def growth_rows(by_form: dict[str, list[dict]]) -> list[dict]:
    out = []
    for form, rows in by_form.items():
        rows = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["L"])
        if len(rows) >= 2:
            out.append({"candidate": form, "widths": ",".join(str(r["L"]) for r in rows),
                        "exponent_total": round(growth(rows), 3),
                        "exponent_over_weights": round(growth(rows, base=VOICE_FP16_WEIGHT_BYTES), 3),
                        "exponent_widest_pair": round(growth(rows[-2:]), 3),
                        "base_bytes": VOICE_FP16_WEIGHT_BYTES})
    return out


def tables() -> None:
    forms = [*FORMS, "banded"]
    found = sorted({int(p.stem.rsplit("_L", 1)[1]) for p in ROWS.glob("*_L*.json") if not p.stem.startswith("fp32")})
    cand = [r for form in forms for w in found if form != "banded" and (r := _row(form, w))]
    cand += _main_gather_rows()
    cand.sort(key=lambda r: (forms.index(r["candidate"]), r["L"]))
    for r in cand:
        r["description"] = candidates.describe(r["candidate"])
    _write("candidates", cand, "Candidate formulations of the relative-shift chains (real encoder, rk3588)")
    chosen = [r for w in found if (r := _row("banded", w))]
    for r in chosen:
        ops = ROWS / f"ops_banded_L{r['L']}.json"
        r["cpu_ops"] = json.loads(ops.read_text())["cpu_ops"] if ops.exists() else ""
    _write("widths", chosen, "banded.rewrite_banded on the real encoder per width (rk3588)")
    gather = [r for r in cand if r["candidate"] == "gather"]
    _write("growth", growth_rows({"banded": chosen, "gather": gather,
                                  "floor": [r for r in cand if r["candidate"] == "floor"]}),
           "Growth exponents of engine bytes in L")
    fp32 = [dict(x, candidate=form) for form in forms for w in found
            if (p := ROWS / f"fp32_{form}_L{w}.json").exists() for x in json.loads(p.read_text())]
    _write("fp32", fp32, "fp32 gates: rewritten (padded) vs exact-length raw slice, and vs folded")
    sims = [dict(s, candidate=form, L=w) for form in forms for w in found
            if (p := ROWS / f"{form}_L{w}.json").exists() for s in json.loads(p.read_text())["sim"]]
    _write("simulator", sims, "Simulator (fp16) vs fp32 raw slice per token count")
    compare = []
    for w in found:
        g, b = ROWS / f"many_gather_L{w}.json", ROWS / f"many_banded_L{w}.json"
        if g.exists() and b.exists():
            gs, bs = json.loads(g.read_text())["sim"], json.loads(b.read_text())["sim"]
            for x, y in zip(gs, bs):
                compare.append({"L": w, "tokens": x["tokens"],
                                "gather_stats_db": round(x["stats_snr_db"], 2), "banded_stats_db": round(y["stats_snr_db"], 2),
                                "gather_cond_db": round(x["cond_snr_db"], 2), "banded_cond_db": round(y["cond_snr_db"], 2),
                                "banded_minus_gather_worst_db": round(min(y["stats_snr_db"], y["cond_snr_db"])
                                                                      - min(x["stats_snr_db"], x["cond_snr_db"]), 2)})
    _write("sim_compare", compare, "Simulator SNR vs fp32, gather vs banded, many token counts")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("candidates", "widths", "simcompare", "tables"))
    ap.add_argument("--forms", nargs="+", help="only these candidates (default: PLAN)")
    ap.add_argument("--widths", nargs="+", type=int, help="only these widths")
    ap.add_argument("--force", action="store_true", help="rebuild rows that exist")
    args = ap.parse_args()
    if args.what == "tables":
        tables()
        return 0
    voice = piper.Voice()
    if args.what == "simcompare":
        simcompare(voice, args.widths or (64, 128), args.force)
        tables()
        return 0
    plan = PLAN if args.what == "candidates" else {w: ("banded",) for w in WIDTHS}
    plan = {w: tuple(f for f in forms if not args.forms or f in args.forms)
            for w, forms in plan.items() if not args.widths or w in args.widths}
    run(voice, plan, args.force, verbose=args.what == "candidates", census=args.what == "widths")
    tables()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
