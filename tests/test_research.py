"""The research scripts stay runnable: each is smoke-tested on the smallest real case it handles.

research/relshift_candidates builds every relative-shift layout it compares on the real Piper encoder;
here each layout is made at a small width and checked exact in fp32 against the raw slice (the gate the
script applies before building anything), except the control that zeroes both terms on purpose.
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
