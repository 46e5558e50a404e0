"""What the curves say (host): the cheapest setting at each perceptual bar, the goal, the uniform dtypes
and the per-target dtype summary.

Conclusions are computed from the measured rows here, in one place, so a notebook states them from the
rows it cites and a test can check them against the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

FP16_LIKE_PESQ = 0.1  # within this of fp16's PESQ-WB: perceived as fp16 (the goal's bar)
GOOD_PESQ = 3.5       # the second bar: good speech, if not fp16's
GOAL_LOW_BIT_SHARE = 0.8  # the goal: most of the conv MACs on weights of 8 bits or fewer
FP16_LIKE = "fp16-like (PESQ-WB within 0.1 of fp16)"
GOOD = f"PESQ-WB >= {GOOD_PESQ:g}"
GOAL = (f"at least {GOAL_LOW_BIT_SHARE:.0%} of its conv MACs on weights of 8 bits or fewer, "
        f"PESQ-WB within {FP16_LIKE_PESQ:g} of fp16")


def cheapest(rows: Sequence[Mapping], fp16: Mapping) -> list[dict]:
    """For one stage and target: the measured setting with the largest share of conv MACs on weights of
    8 bits or fewer (then the smallest engine) at fp16-like perception (PESQ-WB within FP16_LIKE_PESQ of
    the fp16 row's) and at PESQ-WB >= GOOD_PESQ, from rows scored on the full evaluation; where no row
    reaches a bar, the row says so and names the best PESQ-WB measured. Speed is the board's to settle."""
    out = []
    fp16_pesq = fp16.get("pesq_wb")
    scored = [r for r in rows if r.get("scored_on") == "full" and r.get("dtype") != "fp16"
              and isinstance(r.get("pesq_wb"), (int, float))]
    for criterion, bar in ((FP16_LIKE, fp16_pesq - FP16_LIKE_PESQ if isinstance(fp16_pesq, (int, float)) else None),
                           (GOOD, GOOD_PESQ)):
        base = {"stage": fp16["stage"], "soc": fp16["target"], "criterion": criterion,
                "pesq_wb_bar": round(bar, 3) if bar is not None else "", "fp16_pesq_wb": fp16_pesq,
                "fp16_engine_bytes": fp16.get("engine_bytes")}
        reach = [r for r in scored if bar is not None and r["pesq_wb"] >= bar]
        best = max(reach, key=lambda r: (r.get("low_bit_mac_share") or 0.0, -(r.get("engine_bytes") or 0)),
                   default=None)
        if best is None:
            top = max(scored, key=lambda r: r["pesq_wb"], default=None)
            why = (f"no measured setting reaches it: the best quantized PESQ-WB is {top['pesq_wb']:.2f} "
                   f"({top['setting']})" if top else "no setting was scored")
            out.append({**base, "found": False, "setting": "", "why_none": why, "summary": f"none ({why})",
                        "where": "simulator", "target": fp16["target"]})
            continue
        out.append({**base, "found": True, "setting": best["setting"], "dtype": best["dtype"],
                    "pesq_wb": best["pesq_wb"], "stoi": best.get("stoi"), "dnsmos_ovrl": best.get("dnsmos_ovrl"),
                    "utterance_snr_db": best.get("utterance_snr_db"),
                    "window_snr_db_min": best.get("window_snr_db_min"),
                    "low_bit_mac_share": best.get("low_bit_mac_share"),
                    "low_bit_weight_share": best.get("low_bit_weight_share"), "engine_bytes": best.get("engine_bytes"),
                    "goal_share_met": (best.get("low_bit_mac_share") or 0.0) >= GOAL_LOW_BIT_SHARE,
                    "speed": "board-only", "why_none": "",
                    "summary": f"{best['setting']} ({best['dtype']}: PESQ-WB {best['pesq_wb']:.2f}, "
                               f"{best.get('low_bit_mac_share') or 0.0:.0%} of the conv MACs on weights of 8 bits or "
                               f"fewer, {best.get('engine_bytes')} bytes)",
                    "where": "simulator", "target": fp16["target"]})
    return out


def uniform(rows: Iterable[Mapping]) -> list[dict]:
    """Rows with one set of columns (every column any row has, in first-seen order; '' where a row has
    none): a table mixes plain settings, search points and ranked hybrids, each with columns of its own."""
    rows = list(rows)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k, "") for k in columns} for r in rows]


def goal_rows(cheapest_rows: Sequence[Mapping], stage: str) -> list[dict]:
    """The goal's verdict for `stage`, from its cheapest rows at fp16-like perception on every SoC: met when
    one of them has at least GOAL_LOW_BIT_SHARE of its conv MACs on weights of 8 bits or fewer; the largest
    share found, with its SoC and setting, either way (0 and 'none' when no SoC has a setting at the bar)."""
    mine = [r for r in cheapest_rows if r["stage"] == stage and r["criterion"] == FP16_LIKE]
    best = max((r for r in mine if r.get("found")), key=lambda r: r.get("low_bit_mac_share") or 0.0, default=None)
    share = (best or {}).get("low_bit_mac_share") or 0.0
    return [{"stage": stage, "socs": " ".join(r["soc"] for r in mine), "goal": GOAL,
             "verdict": "met" if share >= GOAL_LOW_BIT_SHARE else "not met",
             "best_low_bit_mac_share": share, "best_soc": best["soc"] if best else "none",
             "best_setting": best["setting"] if best else "none", "where": "simulator",
             "target": best["soc"] if best else "none"}]


def dtype_summary(probe_rows: Sequence[Mapping]) -> list[dict]:
    """Per SoC of the probe: the dtypes it builds and simulates, refuses, and crashes on, in one phrase."""
    out = []
    for soc in dict.fromkeys(r["target_soc"] for r in probe_rows):
        mine = [r for r in probe_rows if r["target_soc"] == soc]
        built = [r["dtype"] for r in mine if r["simulates"]]
        refused = [r["dtype"] for r in mine if r["status"].startswith("refused")]
        crashed = [r["dtype"] for r in mine if r["status"].startswith("crashed")]
        parts = [f"builds {', '.join(built)}" if built else "builds none"]
        parts += [f"refuses {', '.join(refused)}"] if refused else []
        parts += [f"crashes on {', '.join(crashed)}"] if crashed else []
        out.append({"target_soc": soc, "builds": " ".join(built), "refuses": " ".join(refused),
                    "crashes": " ".join(crashed), "summary": "; ".join(parts), "where": "host", "target": soc})
    return out
