"""Kokoro measurement 6 in the simulator: the global-statistics engine (every AdaIN's mean and 1/std of a
full-length decode fed in as two more inputs, the seeds' 7-input form) walked over a real utterance.

    python -m scripts.kokoro_fed_statistics [--utterance short] [--target rk3588]

Notebook 03 measures the variant in fp32 only (exact: the diagnosis holds). The seeds' board saturated
fp16 with fed statistics; this says what the PC simulator does with the same graph: one build, the walk
in the simulator and in onnxruntime fp32, each against the full-length fp32 decode, and the largest
|gen| and non-finite count of the simulator's render. Writes results/kokoro_generator/
global_statistics_simulator.csv (rows stamped with this commit) and prints them.
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--utterance", default="short")
    ap.add_argument("--target", default="rk3588")
    args = ap.parse_args()

    from rkstudy import gates
    from rkstudy.families.kokoro_generator import head
    from rkstudy.families.kokoro_generator import study as ks
    from rkstudy.families.kokoro_generator.producer import DEFAULT_CONTEXT, DEFAULT_FRAMES, load_model
    from rkstudy.runtime import OrtRunner
    from rkstudy.tables import results

    model = load_model()
    utt = model.utterance(args.utterance)
    _, renders = ks.global_statistics(model, utt)
    full, stats = renders["full"], renders["statistics"]
    path = ks.fed_stats_graph(model)
    eng = ks.simulated(path, args.target)
    try:
        eng.report.raise_for_status()
        walked = {"simulator": (ks.fed_stats_walk(eng, model, utt, stats), eng),
                  "onnxruntime fp32": (ks.fed_stats_walk(OrtRunner(path), model, utt, stats), results.Origin("fp32"))}
    finally:
        eng.close()
    a_full = head.istft(full, model.head)
    rows = []
    for name, (gen, by) in walked.items():
        finite = np.isfinite(gen)
        a = head.istft(np.where(finite, gen, 0), model.head)
        rows.append(results.stamp({
            "utterance": utt.name, "frames": utt.frames, "window": DEFAULT_FRAMES, "context": DEFAULT_CONTEXT,
            "statistics": "full-length statistics fed (7-input graph)", "runtime": name,
            "gen_snr_vs_full_db": gates.snr_db(full, np.where(finite, gen, 0)),
            "audio_snr_vs_full_db": gates.snr_db(a_full, a), "gen_max_abs": float(np.max(np.abs(gen[finite]))),
            "gen_nonfinite": int((~finite).sum()),
            "regtask": eng.report.regtask if name == "simulator" else ""}, by))
    print(results.write_table("kokoro_generator", "global_statistics_simulator", rows,
                              title="Kokoro generator: the global-statistics engine walked in the simulator "
                                    "(scripts/kokoro_fed_statistics.py)"))
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
