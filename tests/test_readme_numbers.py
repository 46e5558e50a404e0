"""Every measured number the README's prose quotes is recomputed here from the committed table that holds
it, so the prose cannot drift from the tables: a claim whose text is not in README.md, or whose table now
says something else, fails; so does a measured number in the checked sections that no claim covers."""

import math
import re

import pytest

from rkstudy.paths import REPO, RESULTS
from rkstudy.tables import results

README = (REPO / "README.md").read_text(encoding="utf-8")
# The prose sections whose every measured number must be a claim below.
CHECKED = README[README.index("### Stateful step or window walk?"):README.index("## Command line")]
MEASURED = re.compile(r"(?:N\^)?\d[\d,.]*(?:\s?(?:%|dB|MB|GB|GiB|KiB|ms|x\b|frames|sentences|REGTASK))")


def rows(table: str, **where) -> list[dict]:
    return [r for r in results.read_table(RESULTS / f"{table}.csv") if all(r[k] == v for k, v in where.items())]


def floats(table: str, column: str, **where) -> list[float]:
    return [float(r[column]) for r in rows(table, **where) if r[column] != ""]


def one(table: str, column: str, **where) -> float:
    (value,) = floats(table, column, **where)
    return value


def finite(values):
    return [v for v in values if math.isfinite(v)]


def _macs():
    over = [100 * (1 / float(r["compute_ratio"]) - 1) for r in rows("piper_decoder_stateful/macs")
            if r["path"].startswith("stateful step")]
    return f"MACs per emitted frame {min(over):.2f}-{max(over):.2f} %"


def _exactness():
    f64 = finite(floats("piper_decoder_stateful/exactness", "f64_step_vs_full_db"))
    fp32 = floats("piper_decoder_stateful/exactness", "fp32_step_vs_full_db")
    identical = sum(1 for v in fp32 if v == math.inf)
    return (f"(float64: {min(f64):.0f}-{max(f64):.0f} dB against it, or identical, on every sentence; fp32: "
            f"{min(finite(fp32)):.0f}-{max(finite(fp32)):.0f} dB, and identical on {identical} of {len(fp32)}\n"
            "sentences)")


def _state():
    r = rows("piper_decoder_stateful/state", emit="45")[0]
    return (f"lookahead of {float(r['lookahead_frames']):.2f} frames\n({float(r['lookahead_ms']):.1f} ms of audio; "
            f"at E = 45 the first real sample leaves after {float(r['first_audio_ms']):.1f} ms of latent), a "
            f"{float(r['state_kib']):.1f} KiB state\ncarried in and out of every call ({r['state_tensors']} tensors")


def _step_regtask():
    e45 = rows("piper_decoder_stateful/builds", graph="stateful step E=45", target="rk3588")[0]
    e93 = rows("piper_decoder_stateful/builds", graph="stateful step E=93", target="rk3588")[0]
    return (f"(rk3588: {e45['regtask']} at E = 45, largest\nfield value {int(e45['regtask_max_value']):,}; at E = 93 "
            f"the value reaches {int(e93['regtask_max_value']):,})")


def _window():
    r = rows("piper_decoder/window_sweep", window="93", kind="interior")[0]
    context = rows("piper_decoder/window_plan", target="rk3588", snr_target_db="80")[0]["min_context_speech"]
    return (f"the worst interior window scores {float(r['min_snr_db']):.1f} dB against a full decode\n(median "
            f"{float(r['median_snr_db']):.1f} dB), and the window planner finds {context} frames of context for 80 dB")


def _walk_cost():
    ratio = one("piper_decoder_stateful/macs", "compute_ratio", path="window walk 93 = 45 + 2x24")
    return f"the 93-frame window walk spends {1 / ratio:.2f}x"


def _mb(relshift: str, frames: int) -> float:
    return one("piper_encoder/relshift_growth", "engine_mb", relshift=relshift, frames=str(frames))


def _gather():
    exponent = one("piper_encoder/growth", "exponent_total", quantity="engine_bytes")
    return (f"grows as N^{exponent:.2f} (rk3588: {_mb('gather', 64):.0f} MB\nat width 64, {_mb('gather', 128):.0f} MB "
            f"at 128, {_mb('gather', 256) / 1000:.1f} GB at 256)")


def _banded():
    f = rows("piper_encoder/relshift_findings", relshift="banded")[0]
    offsets = [int(x) for x in f["offsets"].split(",")]
    return (f"(Piper: {f['diagonals']}, offsets −{-min(offsets)}..{max(offsets)}) and sums over those alone, with "
            f"shared diagonal masks: {_mb('banded', 64):.1f} MB at 64, {_mb('banded', 128):.1f} MB at\n128, "
            f"{_mb('banded', 320):.1f} MB at 320, {_mb('banded', 512):.1f} MB at 512")


def _banded_exact():
    snr = min(floats("piper_encoder/pad_safety", "measured", relshift="banded"))
    diff = max(floats("piper_encoder/pad_safety", "stats_max_diff", relshift="banded")
               + floats("piper_encoder/pad_safety", "cond_max_diff", relshift="banded"))
    assert diff <= 1e-5
    sim = {k: min(finite(floats("piper_encoder/relshift_growth", "sim_worst_snr_db", relshift=k)))
           for k in ("banded", "gather")}
    return (f"exact in fp32 ({snr:.0f} dB, max |diff| ≤ 1e-5) and {sim['banded']:.2f} dB in the\nsimulator like "
            f"the gather form ({sim['gather']:.2f} dB)")


def _ladder():
    gather = rows("piper_encoder/ladder_plan", ladder="gather", chunk_chars="100")[0]
    banded = rows("piper_encoder/ladder_plan", ladder="banded", chunk_chars="100")[0]
    assert banded["on_fp32_fallback"] == "0" and banded["on_engines"] == banded["chunks"]
    words = {1: "one", 2: "two", 8: "eight"}
    return (f"rungs {banded['widths'].replace(',', '/')} runs every chunk\nof the long text on an engine (gather "
            f"{gather['widths'].replace(',', '/')}: {words[int(gather['on_fp32_fallback'])]} of "
            f"{words[int(gather['chunks'])]} on the fp32 fallback)")


def _drift():
    worst = max(abs(v) for v in floats("piper_encoder/drift_summary", "drift_min_pct", relshift="banded")
                + floats("piper_encoder/drift_summary", "drift_max_pct", relshift="banded"))
    moved = "no chunk's frame count moves" if worst == 0 else "some chunk's frame count moves"
    return f"the largest duration drift\nper chunk in the simulator is {worst:g} % ({moved})"


def _pull_request_board():
    values = [v for n in (128, 192, 384)
              for v in results.reference_numbers("piper_encoder", f"SNR vs fp32 n{n} (stats / cond)")]
    return f"ran on a board at {min(values):.1f}–{max(values):.1f} dB"


def _reproduce():
    table = rows("benchmarks/reproduce")
    # the total closes the steps timed at its commit; a step carried from an earlier run (its code unchanged
    # since) is named with the commit that timed it, never added in
    ran = [float(r["minutes"]) for r in table if r["step"] != "total" and r["carried_from"] == ""]
    carried = sorted({r["commit"] for r in table if r["step"] != "total" and r["carried_from"] != ""})
    n_carried = sum(1 for r in table if r["step"] != "total" and r["carried_from"] != "")
    total = next(float(r["minutes"]) for r in table if r["step"] == "total")
    runs = f"the run at {carried[0]}" if len(carried) == 1 else f"the runs at {' and '.join(carried)}"
    more = f", {n_carried} more timed by {runs}," if n_carried else ""
    return f"took {total:.1f} min for {len(ran)} steps ({sum(ran):.1f} min summed over them){more} on\n2 cores"


CLAIMS = [_macs, _walk_cost, _exactness, _state, _step_regtask, _window, _gather, _banded, _banded_exact, _ladder,
          _drift, _pull_request_board, _reproduce]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.__name__.strip("_") for c in CLAIMS])
def test_the_readme_quotes_what_the_table_holds(claim):
    assert _flat(claim()) in _flat(README), f"README.md should say: {_flat(claim())!r}"


def test_every_measured_number_in_the_checked_prose_is_a_claim():
    rest = _flat(CHECKED)
    for claim in CLAIMS:
        rest = rest.replace(_flat(claim()), " ")
    assert MEASURED.findall(rest) == []
