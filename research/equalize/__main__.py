"""Equalization before quantization on the Piper decoder window (research, not a study).

From the repository root:

    python -m research.equalize sim      # the pass on the real window, then the quantizer's model (no toolkit)
    python -m research.equalize builds   # toolkit builds of the variants, scored in the simulator
    python -m research.equalize tables   # build/equalize/results/*.csv and *.md from the saved rows

`sim`: what the pass equalizes and skips, its exactness on calibration and held-out windows, the
per-channel ranges of the decoder's tensors, each conv's quantization error alone, the walked
evaluation with the whole graph or one decoder stage quantized (w8a8, w8a16, w4a16, weights or
activations alone), and bias correction for 8- and 4-bit weights. `builds`: rk3588 fp16 and w8a8 and
each decoder stage alone in int8 (rest float16), rk3576 w4a16, rk3562 w8a16, for the original and the
equalized window (`--plan` narrows it; `--texts short phone speak_443` scores on ~29 s of speech instead
of the study's 5 s). Rows are saved under build/equalize/rows/ and the tables made from them stay under
build/equalize/results/: no committed table comes from this script.
"""

from __future__ import annotations

import argparse
import json
import time

from . import host

ROWS = host.OUT / "rows"
RESULTS = host.OUT / "results"
BUILT = ("original", "equalized, activation ranges")
PLAN = ([(v, "rk3588", s) for v in BUILT for s in ("w8a8", *(f"{b} alone" for b in host.STAGES),
                                                    "/dec stage 2 alone, search")]
        + [("original", "rk3588", "fp16")]
        + [("original", "rk3588", f"/dec stage 2 alone, {a}") for a in ("kl_divergence", "mmse")]
        + [(v, "rk3576", "w4a16") for v in BUILT] + [(v, "rk3562", "w8a16") for v in BUILT]
        + [("original", t, "fp16") for t in ("rk3576", "rk3562")]
        + [("original", t, "w8a16") for t in ("rk3588", "rk3576")])


def _save(name: str, rows: list[dict]) -> None:
    ROWS.mkdir(parents=True, exist_ok=True)
    (ROWS / f"{name}.json").write_text(json.dumps(rows, indent=1, default=float))


def sim(quick: bool) -> None:
    from rkstudy.families.piper.voice import Voice

    voice = Voice()
    st = host.stage(voice, quick)
    feeds = host.calibration(st)
    held = host.held_out(voice, st)
    check = feeds[:2] + held[:: max(1, len(held) // 4)]
    started = time.monotonic()
    made = host.variants(st, feeds, check)
    paths = {label: path for label, (path, _) in made.items()}
    block = host.block_of(st.onnx)
    groups, exact, ranges, layers = [], [], [], []
    for label, (path, eq) in made.items():
        if eq is not None:
            groups += host.group_rows(eq, label)
            exact += host.exactness_rows(eq, label)
            print(label, eq.summary(), flush=True)
        ranges += host.range_rows(path, feeds, label, block)
        layers += host.layer_rows(path, feeds[:8], label, block)
    _save("groups", groups)
    _save("exactness", exact)
    _save("ranges", ranges)
    _save("layers", layers)
    bias, corrected = [], {}
    for label in BUILT:
        rows, by_bits = host.bias_rows(st, paths[label], feeds, held, label)
        bias += rows
        corrected.update({f"{label}, bias-corrected for {b}-bit weights": p for b, p in by_bits.items()})
    _save("bias", bias)
    rows = host.sim_rows(st, paths, feeds, block)
    rows += host.sim_rows(st, corrected, feeds, block, blocks=(None,),
                          configs=[c for c in host.SIM_CONFIGS if c[0] in ("w8a8", "w8 weights only", "w4a16")])
    rows += host.sim_rows(st, {k: paths[k] for k in BUILT}, feeds, block, blocks=(None, "/dec stage 2"),
                          configs=host.BOUND_CONFIGS, fp32=False)
    _save("sim", rows)
    print(f"sim: {(time.monotonic() - started) / 60:.1f} min", flush=True)


def builds(quick: bool, plan: list[tuple[str, str, str]], texts: list[str] | None = None) -> None:
    from rkstudy.families.piper.voice import Voice

    voice = Voice()
    st = host.stage(voice, quick, texts)
    feeds = host.calibration(st)
    made = host.variants(st, feeds, feeds[:2], labels=sorted({v for v, _, _ in plan}, key=list(host.VARIANTS).index))
    started = time.monotonic()
    rows = host.builds(st, {label: path for label, (path, _) in made.items()}, plan)
    _save("builds" + ("-quick" if quick else "") + (f"-{'-'.join(texts)}" if texts else ""), rows)
    print(f"builds: {(time.monotonic() - started) / 60:.1f} min", flush=True)


def tables() -> None:
    import csv

    RESULTS.mkdir(parents=True, exist_ok=True)
    for path in sorted(ROWS.glob("*.json")):
        rows = json.loads(path.read_text())
        if not rows:
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(RESULTS / f"{path.stem}.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, keys)
            w.writeheader()
            w.writerows(rows)
        fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
        lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
        (RESULTS / f"{path.stem}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("sim", "builds", "tables"))
    ap.add_argument("--quick", action="store_true", help="one calibration text, one evaluation window")
    ap.add_argument("--plan", nargs="+", help="only the builds whose 'variant|target|setting' contains one of these")
    ap.add_argument("--texts", nargs="+", help="evaluation texts of the builds (data/texts; default: the study's)")
    args = ap.parse_args()
    if args.what == "sim":
        sim(args.quick)
    elif args.what == "builds":
        plan = [p for p in PLAN if not args.plan or any(s in "|".join(p) for s in args.plan)]
        builds(args.quick, plan, args.texts)
    tables()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
