import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkstudy.window import plan_windows, walk_windows, window_inputs

shapes = st.tuples(st.integers(1, 700), st.integers(1, 64), st.integers(0, 32))


@given(shapes)
@settings(max_examples=300, deadline=None)
def test_every_frame_is_emitted_once_in_order(shape):
    n, emit, context = shape
    window = emit + 2 * context
    plan = plan_windows(n, emit, context)
    emitted = np.concatenate([np.arange(w.emit_start, w.emit_stop) for w in plan])
    assert np.array_equal(emitted, np.arange(n))
    for w in plan:
        assert 0 <= w.start <= w.emit_start < w.emit_stop <= w.start + w.real
        assert w.start + w.real <= n
        if n <= window:
            assert len(plan) == 1 and w.start == 0 and w.real == n
        else:
            assert w.real == window  # only a short latent is padded
            # emitted frames keep at least `context` real frames of context where the latent has them
            assert w.offset >= min(context, w.emit_start)
            right = w.start + window - w.emit_stop
            assert right >= min(context, n - w.emit_stop)


def test_end_window_extends_its_left_context():
    # 100 frames, window 93 = 45 + 2*24: the second window would start at 21 and run past the end;
    # it is moved left to end on frame 100, so its left context is 45 + 7 = 52 frames.
    plan = plan_windows(100, 45, 24)
    assert [(w.start, w.emit_start, w.emit_stop) for w in plan] == [(0, 0, 45), (7, 45, 90), (7, 90, 100)]
    assert plan[-1].offset == 83


def test_short_latent_is_one_padded_masked_window():
    latent = np.arange(3 * 30, dtype=np.float32).reshape(3, 30) + 1
    (w,) = plan_windows(30, 45, 24)
    x, mask = window_inputs(latent, w, 93)
    assert x.shape == (3, 93) and mask.shape == (1, 93)
    assert np.array_equal(x[:, :30], latent) and not x[:, 30:].any()
    assert mask[0, :30].all() and not mask[0, 30:].any()


@given(shapes, st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_stitched_output_voices_each_frame_once(shape, hop):
    n, emit, context = shape
    latent = np.tile(np.arange(n, dtype=np.float32), (2, 1))

    def engine(x, mask):  # "decodes" each frame to `hop` copies of its index, zero where masked
        return np.repeat(x[:1] * mask, hop, axis=-1)

    out = walk_windows(latent, engine, emit=emit, context=context, samples_per_frame=hop, progress=False)
    assert np.array_equal(out, np.repeat(np.arange(n, dtype=np.float32), hop)[None])


def test_walk_refuses_a_mismatched_engine():
    with pytest.raises(ValueError, match="expected 930 .*10 per frame"):
        walk_windows(np.zeros((4, 200), np.float32), lambda x, m: np.zeros((1, 900)), emit=45,
                     context=24, samples_per_frame=10, progress=False)
    with pytest.raises(ValueError, match=r"drop the batch axis"):
        walk_windows(np.zeros((1, 4, 200), np.float32), lambda x, m: x, emit=45, context=24,
                     samples_per_frame=1, progress=False)
    with pytest.raises(ValueError, match="emit > 0"):
        plan_windows(10, 0, 4)
