import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rkstudy.walk.window import Rate, plan_windows, raised_cosine, walk, walk_windows, window_inputs

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


def _frame_engine(feed):
    """A two-rate "engine" in the shape of Kokoro's generator: each output column carries the latent
    frame it belongs to (60 columns per frame, the +1 column the last real frame's), zero where the
    fine-rate mask is 0."""
    x, m60 = feed["x"], feed["m60"]
    real = int(m60.sum() - 1) // 60
    cols = x[0, np.minimum(np.arange(m60.shape[-1]) // 60, real - 1)]
    return [(cols * m60[0])[None]]


@given(st.integers(1, 500), st.integers(1, 48), st.integers(0, 24))
@settings(max_examples=150, deadline=None)
def test_two_rates_with_an_extra_column_stitch_exactly(n, emit, context):
    """Kokoro's contract: x walked at 1/frame, har and the output at 60/frame + 1, the masks at 10/frame
    and 60/frame + 1; the stitched output is every frame's columns once, the +1 tail from the last window."""
    x = np.arange(n, dtype=np.float32)[None]
    har = np.zeros((3, 60 * n + 1), np.float32)
    seen = []

    def run(feed):
        window = emit + 2 * context
        assert feed["har"].shape == (3, 60 * window + 1) and feed["m10"].shape == (1, 10 * window)
        real = int(feed["m10"].sum()) // 10
        assert feed["m60"].sum() == 60 * real + 1 and feed["m60"].shape == (1, 60 * window + 1)
        seen.append(real)
        return _frame_engine(feed)

    (out,) = walk(n, run, emit=emit, context=context, walked={"x": (x, Rate()), "har": (har, Rate(60, 1))},
                  masks={"m10": Rate(10, 0), "m60": Rate(60, 1)}, outputs=[Rate(60, 1)], progress=False)
    expected = np.append(np.repeat(np.arange(n, dtype=np.float32), 60), n - 1)
    assert np.array_equal(out[0], expected)
    assert seen == [min(n, emit + 2 * context)] * len(seen)


@given(st.integers(1, 400), st.integers(2, 48), st.integers(0, 24), st.data())
@settings(max_examples=200, deadline=None)
def test_overlapping_windows_cover_every_frame_and_blend_to_the_same_signal(n, emit, context, data):
    overlap = data.draw(st.integers(0, emit // 2))
    plan = plan_windows(n, emit, context, overlap)
    assert plan[0].emit_start == 0 and plan[-1].emit_stop == n
    for a, b in zip(plan, plan[1:]):
        assert b.emit_start == a.emit_start + emit - overlap and a.emit_stop - b.emit_start == overlap
    x = np.arange(n, dtype=np.float32)[None]
    (out,) = walk(n, _frame_engine, emit=emit, context=context, walked={"x": (x, Rate())},
                  masks={"m60": Rate(60, 1)}, outputs=[Rate(60, 1)], progress=False, overlap=overlap)
    # every window renders a frame the same way, so the blend (weights summing to one) is that render
    expected = np.append(np.repeat(np.arange(n, dtype=np.float32), 60), n - 1)
    np.testing.assert_allclose(out[0], expected, rtol=1e-6, atol=1e-4)


def test_overlap_blends_two_renders_with_a_raised_cosine():
    r = raised_cosine(120)
    np.testing.assert_allclose(r + r[::-1], 1.0, atol=1e-7)
    assert r[0] < 0.001 and r[-1] > 0.999 and np.all(np.diff(r) > 0)
    # window k renders every frame as k: in the 2-frame overlap the output crosses from 0 to 1
    calls = []

    def engine(feed):
        calls.append(len(calls))
        return [np.full((1, 60 * 14 + 1), float(calls[-1]), np.float32)]

    (out,) = walk(20, engine, emit=10, context=2, walked={"x": (np.zeros((1, 20), np.float32), Rate())},
                  outputs=[Rate(60, 1)], progress=False, overlap=2)
    assert len(calls) == 3  # emits [0,10), [8,18), [16,20)
    np.testing.assert_allclose(out[0, 480:600], r, atol=1e-7)
    assert np.all(out[0, :480] == 0) and np.all(out[0, 600:960] == 1)
    with pytest.raises(ValueError, match="overlap=6 must be in 0..5"):
        plan_windows(50, 10, 2, overlap=6)


def test_adjust_rescales_each_window_before_stitching():
    seen = []

    def adjust(w, outs):
        seen.append((w.emit_start, w.emit_stop))
        return [o * (1 + w.emit_start) for o in outs]

    x = np.ones((1, 30), np.float32)
    (out,) = walk(30, lambda feed: [feed["x"]], emit=10, context=3, walked={"x": (x, Rate())},
                  outputs=[Rate()], progress=False, adjust=adjust)
    assert seen == [(0, 10), (10, 20), (20, 30)]
    assert np.array_equal(out[0], np.repeat([1.0, 11.0, 21.0], 10))
