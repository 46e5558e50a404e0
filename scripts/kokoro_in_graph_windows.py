"""Kokoro measurement 4, piece by piece: is the batched in-graph window's fp16 cost the batch or the window?

    python -m scripts.kokoro_in_graph_windows [--utterance long] [--target rk3588]

Notebook 03's sweep measures the in-graph W = 256 engine (three inner windows of 134 frames stacked on
the batch axis) at 53.7 dB against fp32, where the one-window W = 256 engine on the same frames gives
65.6 dB. This runs the last W = 256 window of the utterance's walk three ways in the simulator (the
in-graph engine; each inner window alone through the one-window W = 134 engine; the one-window W = 256
engine) and compares each emitted piece against onnxruntime fp32 on the same graph, so the batch and the
window length are told apart. Three builds, one at a time (the in-graph one peaks near 11 GB). Writes
results/kokoro_generator/in_graph_pieces.csv (rows stamped with this commit) and prints it.
"""

from __future__ import annotations

import argparse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--utterance", default="long")
    ap.add_argument("--target", default="rk3588")
    args = ap.parse_args()

    from rkstudy import gates
    from rkstudy.families.kokoro_generator import generator
    from rkstudy.families.kokoro_generator import study as ks
    from rkstudy.families.kokoro_generator.generator import FINE
    from rkstudy.families.kokoro_generator.producer import (
        DEFAULT_CONTEXT,
        INPUTS,
        inner_frames,
        last_window_feed,
        load_model,
        produce,
        window_feed,
    )
    from rkstudy.runtime import OrtRunner
    from rkstudy.tables import results
    from rkstudy.walk.window import plan_windows

    frames, max_axis, context = 256, FINE * 134 + 1, DEFAULT_CONTEXT
    inner = inner_frames(max_axis)
    model = load_model()
    utt = model.utterance(args.utterance)
    first = plan_windows(utt.frames, frames - 2 * context, context)[-1].start  # the W = 256 window's frame 0
    feed = last_window_feed(utt, frames, context)
    walk = generator.InGraphWalk(model.trunk(generator.ENGINE, clamp_count=True), frames, inner, context)

    def simulate(produced, feeds):
        """fp32 and simulator outputs of `produced` on each feed (one build, closed after)."""
        ort = OrtRunner(produced.path)
        with ks.engine(produced, args.target) as eng:
            eng.report.raise_for_status()
            return [(ort.run(f)[0], eng.run([f[k] for k in INPUTS])[0]) for f in feeds]

    (walked,) = simulate(produce(frames, context, max_axis=max_axis, model=model), [feed])
    (whole,) = simulate(produce(frames, context, model=model), [feed])
    alone = dict(zip(walk.starts, simulate(produce(inner, context, model=model),
                                      [window_feed(utt.x, utt.har, utt.style, first + a, inner, inner)
                                       for a in walk.starts])))
    rows = []
    for w in walk.plan:
        last = 1 if w.emit_stop == frames else 0
        out = slice(FINE * w.emit_start, FINE * w.emit_stop + last)  # columns of the W = 256 output
        own = slice(FINE * w.offset, FINE * (w.offset + w.emit_stop - w.emit_start) + last)  # the same in its window
        ref_in, got_in = walked[0][..., out], walked[1][..., out]
        ref_one, got_one = alone[w.start][0][..., own], alone[w.start][1][..., own]
        rows.append(results.stamp({
            "utterance": utt.name, "window": frames, "inner_frames": inner, "inner_start": w.start,
            "emit_start": w.emit_start, "emit_stop": w.emit_stop,
            "fp32_in_graph_vs_inner_window_db": gates.snr_db(ref_one, ref_in),
            "sim_in_graph_db": gates.snr_db(ref_in, got_in),
            "sim_inner_window_alone_db": gates.snr_db(ref_one, got_one),
            "sim_one_window_w256_db": gates.snr_db(whole[0][..., out], whole[1][..., out])},
            results.Origin("simulator", target=args.target)))
    print(results.write_table("kokoro_generator", "in_graph_pieces", rows,
                              title="Kokoro generator: the in-graph window's pieces in the simulator against fp32, "
                                    "beside the same frames alone at W = 134 and in one W = 256 window "
                                    "(scripts/kokoro_in_graph_windows.py)"))
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
