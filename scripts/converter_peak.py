"""The converter's own peak RSS for one ONNX, from a small parent process.

    python -m scripts.converter_peak ENGINE_INPUT.onnx [--target rk3588]

`rkstudy.build.build_engine` reports the toolkit child's ru_maxrss. On Linux that counter
survives the fork+exec that starts the child, so it is at least the parent's RSS at fork time:
from a notebook kernel holding a dozen encoder graphs (~2.6 GiB here) every build reads ~2.6 GiB
however small. Run from this script (the parent imports rkstudy.build and nothing heavy) the
same number is the converter's own peak. Prints one JSON row; builds fresh (reuse=False).
"""

from __future__ import annotations

import argparse
import json
import resource


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("onnx")
    ap.add_argument("--target", default="rk3588")
    args = ap.parse_args()
    from rkstudy.build import build_engine

    parent_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = build_engine(args.onnx, args.target, reuse=False, out=None)
    print(json.dumps({"onnx": args.onnx, "target": args.target, "status": report.status,
                      "engine_bytes": report.engine_bytes, "build_s": round(report.seconds, 1),
                      "regtask": report.regtask, "converter_peak_gib": round(report.peak_rss_mb / 1024, 3),
                      "parent_peak_gib_at_start": round(parent_mb / 1024, 3)}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
