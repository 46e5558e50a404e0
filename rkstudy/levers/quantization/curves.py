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


def below_bar(rows: Sequence[Mapping], fp16_pesq: float) -> list[dict]:
    """The blocks that, alone on low-bit weights with the rest in float16 (rows with an `alone` column), fall
    below fp16-like perception (PESQ-WB under fp16's less FP16_LIKE_PESQ), each with its PESQ-WB and its share
    of the conv MACs, worst first."""
    bar = fp16_pesq - FP16_LIKE_PESQ
    return sorted(({"block": r["alone"], "pesq_wb": r["pesq_wb"], "low_bit_mac_share": r["low_bit_mac_share"] or 0.0,
                    "bar": bar} for r in rows if r.get("alone") and isinstance(r.get("pesq_wb"), (int, float))
                   and r["pesq_wb"] < bar), key=lambda r: r["pesq_wb"])


def goal_reason(best: Mapping | None, rows: Sequence[Mapping]) -> str:
    """Why the goal is met or not, in words from the rows: the setting that meets it; else, per graph
    measured with blocks alone (`rows`' `graph` and `alone` columns, fp16 the bar), each block that alone
    breaks fp16-like perception with its share of the conv MACs, and what that leaves reachable."""
    share = (best or {}).get("low_bit_mac_share") or 0.0
    if share >= GOAL_LOW_BIT_SHARE:
        return (f"met by {best['setting']} on {best['soc']}: {share:.1%} of the conv MACs on weights of 8 bits or "
                f"fewer at PESQ-WB {best['pesq_wb']:.2f}")
    fp16 = next((r for r in rows if r.get("dtype") == "fp16" and isinstance(r.get("pesq_wb"), (int, float))), None)
    parts = []
    for graph in dict.fromkeys(r.get("graph", "") for r in rows if r.get("alone")):
        if fp16 is None:
            break
        mine = [r for r in rows if r.get("graph", "") == graph and r.get("target") == fp16["target"]]
        broken = below_bar(mine, fp16["pesq_wb"])
        if not broken:
            parts.append(f"the {graph} graph: no block alone on 8-bit weights falls below the bar "
                         f"{fp16['pesq_wb'] - FP16_LIKE_PESQ:.2f}, so the loss is in their sum")
            continue
        held = sum(b["low_bit_mac_share"] for b in broken)
        said = ", ".join(f"{b['block']} alone scores PESQ-WB {b['pesq_wb']:.2f} and holds {b['low_bit_mac_share']:.1%} "
                         "of the conv MACs" for b in broken)
        parts.append(f"the {graph} graph on {fp16['target']}: {said} (the bar: {broken[0]['bar']:.2f}), so keeping "
                     f"{'it' if len(broken) == 1 else 'them'} in float16 leaves at most {1 - held:.1%} reachable")
    top = (f"the largest share at fp16-like perception is {share:.1%} ({best['setting']}, {best['soc']})" if best
           else "no quantized setting reaches fp16-like perception")
    return "; ".join([top, *parts]) if parts else f"{top}; no block was measured alone"


def goal_rows(cheapest_rows: Sequence[Mapping], stage: str, rows: Sequence[Mapping] = (),
              evaluation: str = "") -> list[dict]:
    """The goal's verdict for `stage`, from its cheapest rows at fp16-like perception on every SoC (and
    graph): met when one of them has at least GOAL_LOW_BIT_SHARE of its conv MACs on weights of 8 bits or
    fewer; the largest share found, with its SoC, graph and setting, either way (0 and 'none' when no SoC has a
    setting at the bar), and its reason from the measured `rows` (goal_reason). `evaluation` names the
    speech it was judged on."""
    mine = [r for r in cheapest_rows if r["stage"] == stage and r["criterion"] == FP16_LIKE]
    best = max((r for r in mine if r.get("found")), key=lambda r: r.get("low_bit_mac_share") or 0.0, default=None)
    share = (best or {}).get("low_bit_mac_share") or 0.0
    return [{"stage": stage, "socs": " ".join(dict.fromkeys(r["soc"] for r in mine)), "goal": GOAL,
             **({"evaluation": evaluation} if evaluation else {}),
             "verdict": "met" if share >= GOAL_LOW_BIT_SHARE else "not met",
             "best_low_bit_mac_share": share, "best_soc": best["soc"] if best else "none",
             "best_graph": (best or {}).get("graph", "original") if best else "none",
             "best_setting": best["setting"] if best else "none",
             "reason": goal_reason(best, [r for r in rows if r.get("stage") == stage]), "where": "simulator",
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
