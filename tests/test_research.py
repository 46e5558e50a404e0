"""The research scripts stay runnable: each is smoke-tested on the smallest real case it handles.

research/relshift_candidates builds every relative-shift layout it compares on the real Piper encoder;
here each layout is made at a small width and checked exact in fp32 against the raw slice (the gate the
script applies before building anything), except the control that zeroes both terms on purpose.
research/equalize runs on its quick stage without the toolkit.
"""

from __future__ import annotations

import pytest

from research.relshift_candidates import forms
from research.relshift_candidates import host as study

WIDTH = 32


@pytest.fixture(scope="module")
def folded(voice):
    return study.folded(voice, WIDTH)


@pytest.mark.parametrize("form", [f for f in ("gather", "kconv+stack4", "kfirst+stack4", "kconv2+stack4",
                                               "stack4+stack4", "kfirst+stack", "kfirst", "stack", "bmm",
                                               "kfirst+bmm", "masks+stack", "masks+sum", "mm+stack")])
def test_every_candidate_layout_is_exact_in_fp32(voice, folded, form):
    rows = study.fp32_rows(voice, WIDTH, folded, forms.make(form, folded), counts=[17, WIDTH])
    assert all(r["exact"] for r in rows), [(r["tokens"], r["worst_snr_db"], r["worst_max_diff"]) for r in rows]


def test_the_control_layout_is_not_exact(voice, folded):
    rows = study.fp32_rows(voice, WIDTH, folded, forms.make("floor", folded), counts=[WIDTH])
    assert not rows[0]["exact"] and rows[0]["worst_snr_db"] < 60


@pytest.mark.slow
def test_the_equalization_study_runs_on_one_window(voice, one_torch_thread):
    """research/equalize on its quick stage (one calibration text, one evaluation window): the equalized
    window is exact (its fp32 walk within rounding of the original's) and the quantizer's model of a w8a8
    build of either loses the window as the toolkit's w8a8 build does (SNR under 5 dB, PESQ-WB under 3)."""
    from research.equalize import host

    st = host.stage(voice, quick=True)
    feeds = host.calibration(st, samples=4)
    made = host.variants(st, feeds, feeds[:1], labels=("original", "equalized, activation ranges"))
    assert all(r["exact"] for r in made["equalized, activation ranges"][1].exactness)
    rows = host.sim_rows(st, {k: p for k, (p, _) in made.items()}, feeds, host.block_of(st.onnx), blocks=(None,),
                         configs=(("w8a8", 8, 8),), progress=lambda _: None)
    by = {(r["variant"], r["config"]): r for r in rows}
    assert by[("original", "fp32")]["utterance_snr_db"] == float("inf")
    assert by[("equalized, activation ranges", "fp32")]["utterance_snr_db"] > 100
    for variant in made:
        assert by[(variant, "w8a8")]["utterance_snr_db"] < 5 and 1.5 < by[(variant, "w8a8")]["pesq_wb"] < 3
