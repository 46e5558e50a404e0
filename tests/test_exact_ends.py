"""Exact at both ends for a conv graph that masks nothing (rkstudy.graph.validity through make_step):
on the generators of rkstudy.families.port.architectures (seeded random weights: HiFi-GAN V1/V3, MelGAN
with its reflection pads, odd strides with output_padding), the
stateful step equals the full-length decode in float64 over every sample, the first and the last 20
frames included, at several lengths and step sizes and in any chunking; fp32 stays within the fp32
full decode's own rounding. The same masks make a padded window exact, leave a graph that masks
itself (the Piper --dec-mask slice) untouched, and make the unmasked Piper slice exact."""

import numpy as np
import pytest

from rkstudy import gates, graph
from rkstudy.contract import Digest, step_contract
from rkstudy.families.piper.voice import read_text
from rkstudy.families.piper_decoder.producer import produce_for_voice
from rkstudy.families.piper_decoder_stateful.study import decoder_graph
from rkstudy.families.port import architectures
from rkstudy.families.port.architectures import INPUT, MELS, SPEAKER
from rkstudy.graph.delays import NotStreamable
from rkstudy.graph.f64 import F64Runner, run_f64
from rkstudy.graph.stateful import make_step
from rkstudy.graph.validity import mask_boundaries
from rkstudy.runtime import OrtRunner
from rkstudy.walk.stateful import StatefulWalker
from rkstudy.walk.window import Rate, walk

EXACT_DB = 250.0     # float64 rounding is ~280-320 dB here; any boundary error is below 60 dB
ENDS = 20            # frames at each end scored on their own
EMITS = (16, 5)
LENGTHS = (7, 37, 64)   # one shorter than a 16-frame step; 37 a multiple of neither step size
FOLD_FRAMES = 64


pytestmark = pytest.mark.usefixtures("one_torch_thread", "slice_once")


@pytest.fixture(scope="module", params=sorted(architectures.BUILDERS))
def vocoder(request):
    """(the exported vocoder with its dynamic frame axis, the same graph pinned and folded)."""
    v = architectures.BUILDERS[request.param]()
    return v, graph.fold(v.model, {INPUT: (1, MELS, FOLD_FRAMES)})


def walker(step, runner=F64Runner, dtype=np.float64, constants=None) -> StatefulWalker:
    contract = step_contract(step, family="port", masks=(), source=Digest("vocoder.onnx", "0" * 64),
                             producer="rkstudy.graph.stateful.make_step", params={})
    return StatefulWalker(runner(step.model), contract, constants, dtype=dtype)


def mel_of(frames: int) -> np.ndarray:
    return np.random.default_rng(frames).standard_normal((MELS, frames))


def scores(ref: np.ndarray, out: np.ndarray, hop: int) -> dict:
    """SNR over every sample, the first ENDS frames and the last ENDS frames."""
    ref = ref.reshape(out.shape)
    n = ENDS * hop
    return {"all": gates.snr_db(ref, out), "first": gates.snr_db(ref[..., :n], out[..., :n]),
            "last": gates.snr_db(ref[..., -n:], out[..., -n:])}


@pytest.mark.parametrize("emit", EMITS)
def test_the_step_equals_the_full_decode_at_both_ends_in_float64(vocoder, emit):
    v, folded = vocoder
    step = make_step(folded, [INPUT], emit)
    assert step.masks == ("valid",)
    w = walker(step)
    for frames in LENGTHS:
        mel = mel_of(frames)
        outs = w.decode(mel)
        for name, ref, out in zip(v.outputs, run_f64(v.model, {INPUT: mel[None]}), outs):
            assert out.shape[-1] == frames * v.hop
            for where, db in scores(ref, out, v.hop).items():
                assert db >= EXACT_DB, f"{v.name} {name} E={emit} {frames} frames, {where}: {db:.1f} dB"
    # any chunking is the same stream, bit for bit: uneven pieces, and one frame at a time
    mel = mel_of(LENGTHS[1])
    whole = w.decode(mel)
    uneven, single = [mel[:, :1], mel[:, 1:12], mel[:, 12:13], mel[:, 13:]], np.split(mel, mel.shape[1], axis=1)
    for chunks in (uneven, single):
        pieces = list(w.stream(chunks))
        for k, out in enumerate(whole):
            np.testing.assert_array_equal(np.concatenate([p[k] for p in pieces], axis=-1), out)


def test_without_the_masks_both_ends_are_off(vocoder):
    """The same graph and step with mask_ends=False: the interior is exact, the ends are not (conv biases
    outside the real frames), which is what the masks repair; a graph with reflection pads has no step
    without the boundary pass that rewrites them."""
    v, folded = vocoder
    if v.name == "melgan":
        with pytest.raises(NotStreamable, match="a reflect pad reached the step unrewritten"):
            make_step(folded, [INPUT], 16, mask_ends=False)
        return
    step = make_step(folded, [INPUT], 16, mask_ends=False)
    assert step.masks == ()
    mel = mel_of(64)
    (ref, *_), (out, *_) = run_f64(v.model, {INPUT: mel[None]}), walker(step).decode(mel)
    db = scores(ref, out, v.hop)
    assert db["first"] < 60.0 and db["last"] < 60.0
    middle = slice(24 * v.hop, 40 * v.hop)
    assert gates.snr_db(ref.reshape(out.shape)[..., middle], out[..., middle]) >= EXACT_DB


@pytest.mark.parametrize("emit", EMITS)
def test_fp32_is_as_close_as_the_fp32_full_decode(vocoder, emit):
    """fp32 step against the float64 full decode within 6 dB of the fp32 full decode's own distance from it
    (onnxruntime sums short convs in another order; measured within 3.4 dB)."""
    v, folded = vocoder
    w = walker(make_step(folded, [INPUT], emit), OrtRunner, np.float32)
    for frames in LENGTHS:
        mel = mel_of(frames)
        exact = run_f64(v.model, {INPUT: mel[None]})
        full32 = OrtRunner(v.model).run({INPUT: mel[None].astype(np.float32)})
        for ref, f32, out in zip(exact, full32, w.decode(mel.astype(np.float32))):
            floor = gates.snr_db(ref.reshape(out.shape), f32.reshape(out.shape))
            assert 100.0 <= floor and gates.snr_db(ref.reshape(out.shape), out) >= floor - 6.0


def test_only_the_conv_inputs_that_can_be_nonzero_outside_are_masked():
    v = architectures.hifigan(1)
    folded = graph.fold(v.model, {INPUT: (1, MELS, FOLD_FRAMES)})
    valid = mask_boundaries(folded, [INPUT])
    convs = [n.name for n in folded.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    # conv_pre reads the walked mel, zero outside the utterance already; every other conv reaches across time
    assert len(convs) == 40 and set(valid.masked) == set(convs) - {"/conv_pre/Conv"}
    added = [n for n in valid.model.graph.node if n.name not in set(convs) | {x.name for x in folded.graph.node}]
    # the mask at rates 4 and 16 by all-ones ConvTransposes, and one Mul per masked tensor: NPU-plain ops
    assert sorted({n.op_type for n in added}) == ["ConvTranspose", "Mul"]
    assert [(n.op_type, n.output[0]) for n in added if n.op_type == "ConvTranspose"] == [
        ("ConvTranspose", "valid_x4"), ("ConvTranspose", "valid_x16")]
    # one Mul per masked tensor (onnxslim merged the MRF resblocks' identical first LeakyRelus: 4 tensors
    # feed two or three convs each), every reader takes the product
    inputs = {n.input[0] for n in valid.model.graph.node if n.name in valid.masked}
    assert sum(n.op_type == "Mul" for n in added) == len(inputs) == 35
    masked, plain = make_step(folded, [INPUT], 16), make_step(folded, [INPUT], 16, mask_ends=False)
    # the state grows by the mask's own delay lines only (one channel at each rate)
    mask_buffers = [b for b in masked.buffers if b.tensor.startswith("valid")]
    assert {b.shape[:2] for b in mask_buffers} == {(1, 1)}
    assert masked.state_floats - plain.state_floats == sum(b.history for b in mask_buffers) == 435


def test_a_speaker_conditioned_generator_is_exact_with_its_embedding_constant():
    """VITS adds cond(g) after conv_pre: a per-utterance bias that is not zero outside the frames even in a
    graph masked after every conv, so its upsampler's input is masked too."""
    v = architectures.hifigan(3, speaker_dims=8)
    folded = graph.fold(v.model, {INPUT: (1, MELS, FOLD_FRAMES), SPEAKER: (1, 8, 1)})
    step = make_step(folded, [INPUT], 16)
    g = np.random.default_rng(1).standard_normal((1, 8, 1))
    for frames in (7, 37):
        mel = mel_of(frames)
        (ref,) = run_f64(v.model, {INPUT: mel[None], SPEAKER: g})
        (out,) = walker(step, constants={SPEAKER: g}).decode(mel)
        assert min(scores(ref, out, v.hop).values()) >= EXACT_DB


def test_a_padded_window_is_exact_with_the_same_masks():
    """A latent shorter than the window is one window, zero-padded: the padding's conv biases reach the
    last real frames of an unmasked graph; with its conv inputs masked the window is the full decode."""
    v = architectures.hifigan(3)
    window = 48
    pinned = graph.fold(v.model, {INPUT: (1, MELS, window)})
    valid = mask_boundaries(pinned, [INPUT])
    mel = mel_of(30)
    (ref,) = run_f64(v.model, {INPUT: mel[None]})
    for model, masks, at_least in ((valid.model, {valid.mask: Rate()}, EXACT_DB), (pinned, {}, None)):
        (out,) = walk(30, lambda feed, m=model: run_f64(m, feed), emit=16, context=16,
                      walked={INPUT: (mel[None], Rate())}, masks=masks, outputs=[Rate(v.hop)], progress=False)
        db = scores(ref, out, v.hop)
        if at_least:
            assert min(db.values()) >= at_least
        else:   # the start is the graph's own zero padding either way; the padded end is not
            assert db["first"] > 40.0 and db["last"] < 40.0


def test_a_global_reduction_over_time_is_refused_naming_the_node():
    v = architectures.instance_norm()
    folded = graph.fold(v.model, {INPUT: (1, MELS, FOLD_FRAMES)})
    with pytest.raises(NotStreamable) as err:
        make_step(folded, [INPUT], 16)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("InstanceNormalization '/norm/InstanceNormalization' normalises each channel")
    assert "(a global reduction over time)" in message


@pytest.mark.slow
def test_the_piper_slices_through_the_same_path(voice):
    """The --dec-mask slice masks itself: nothing is added and its step is the family's, byte for byte.
    The slice without the decoder mask gets its conv inputs masked and is exact at both ends in float64."""
    masked = produce_for_voice(voice, dec_mask=True).model
    assert mask_boundaries(masked, ["z", "y_mask"]).mask is None
    assert make_step(masked, ["z", "y_mask"], 45).model.SerializeToString() == make_step(
        masked, ["z", "y_mask"], 45, mask_ends=False).model.SerializeToString()

    plain = produce_for_voice(voice, dec_mask=False)
    step = make_step(plain.model, ["z", "y_mask"], 45)
    assert step.masks == ("valid",) and step.delay == 10774
    contract = step_contract(step, family="piper_decoder_stateful", masks=("y_mask",), source=plain.contract.source,
                             producer="rkstudy.graph.stateful.make_step", params={})
    assert [t.role for t in contract.inputs[:3]] == ["walked", "mask", "mask"]
    lat = voice.latents(read_text("short"))[0]
    (ref,) = run_f64(decoder_graph(voice.model, voice.seam), {"z": lat.z[None], "y_mask": np.ones((1, 1, lat.frames))})
    (out,) = StatefulWalker(F64Runner(step.model), contract, dtype=np.float64).decode({"z": lat.z})
    assert min(scores(ref.ravel(), out.ravel(), 256).values()) >= EXACT_DB
