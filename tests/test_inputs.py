"""The one board-input file format (rkstudy.inputs) and its two readers: Piper latents and Kokoro
inputs round-trip, another version or kind is refused in one line naming the command that writes a
new file, the source digest must be a file name and a sha256, and unversioned Piper latents still load."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from rkstudy import inputs
from rkstudy.errors import InputError
from rkstudy.families.kokoro_generator import input_file as kokoro_inputs
from rkstudy.families.kokoro_generator.head import IstftHead
from rkstudy.families.piper import latents
from rkstudy.families.piper.voice import Latent

SOURCE = {"file": "voice.onnx", "sha256": "ab" * 32}
RNG = np.random.default_rng(3)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    said = str(exc.value)
    assert "\n" not in said
    return said


def test_round_trip_keeps_every_array_dtype_and_the_digest(tmp_path):
    f = inputs.InputFile("test kind", SOURCE, [{"a": RNG.standard_normal((2, 3)).astype(np.float32),
                                                "t": np.asarray("héllo")}, {"a": np.arange(4, dtype=np.int64)}],
                         shared={"w": np.eye(2)}, meta={"rate": 22050, "name": "x"})
    path = inputs.save(tmp_path / "f.npz", f, make="make-it")
    got = inputs.load(path, "test kind", make="make-it")
    assert got.kind == "test kind" and got.source == SOURCE and got.meta == {"rate": 22050, "name": "x"}
    assert len(got.sentences) == 2 and set(got.sentences[0]) == {"a", "t"} and set(got.sentences[1]) == {"a"}
    np.testing.assert_array_equal(got.sentences[0]["a"], f.sentences[0]["a"])
    assert got.sentences[0]["a"].dtype == np.float32 and got.sentences[1]["a"].dtype == np.int64
    assert str(got.sentences[0]["t"]) == "héllo"
    np.testing.assert_array_equal(got.shared["w"], np.eye(2))


def test_another_version_or_kind_is_refused_naming_the_command(tmp_path):
    path = inputs.save(tmp_path / "f.npz", inputs.InputFile("test kind", SOURCE, []), make="make-it")
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    np.savez(tmp_path / "v9.npz", **{**data, "rkstudy_inputs": np.asarray(inputs.FORMAT + 8)})
    with pytest.raises(InputError) as exc:
        inputs.load(tmp_path / "v9.npz", "test kind", make="make-it")
    assert _one_line(exc) == (f"v9.npz has inputs format {inputs.FORMAT + 8}, this rkstudy reads format "
                              f"{inputs.FORMAT}; write it again with `make-it`")
    with pytest.raises(InputError, match="holds test kind inputs, not other kind; write the right file with `m2`"):
        inputs.load(path, "other kind", make="m2")
    np.savez(tmp_path / "old.npz", **{k: v for k, v in data.items() if k != "rkstudy_inputs"})
    with pytest.raises(InputError, match=r"an older layout \(no inputs format version\).*`make-it`"):
        inputs.load(tmp_path / "old.npz", "test kind", make="make-it")
    with pytest.raises(InputError, match="no inputs file at .*missing.npz; write one on the host with `make-it`"):
        inputs.load(tmp_path / "missing.npz", "test kind", make="make-it")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="junk.npz is not a readable inputs file"):
        inputs.load(tmp_path / "junk.npz", "test kind", make="make-it")


@pytest.mark.parametrize("source", [{}, {"file": "v.onnx"}, {"file": "v.onnx", "sha256": "ab" * 31},
                                    {"file": "", "sha256": "ab" * 32}, {"file": "v.onnx", "sha256": "AB" * 32}])
def test_the_source_digest_must_name_a_file_and_its_sha256(tmp_path, source):
    with pytest.raises(InputError, match="names no model digest.*write it again with `make-it`"):
        inputs.save(tmp_path / "f.npz", inputs.InputFile("k", source, []), make="make-it")
    assert not (tmp_path / "f.npz").exists()


def test_a_digest_damaged_after_writing_is_refused_on_load(tmp_path):
    path = inputs.save(tmp_path / "g.npz", inputs.InputFile("k", SOURCE, []), make="make-it")
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    np.savez(tmp_path / "bad.npz", **{**data, "source_sha256": np.asarray("ab" * 20)})
    with pytest.raises(InputError) as exc:
        inputs.load(tmp_path / "bad.npz", "k", make="make-it")
    assert _one_line(exc).startswith("bad.npz names no model digest")


def _latents():
    return [Latent(text="Hi. There.", ids=[1, 5, 2], z=RNG.standard_normal((4, 7)).astype(np.float32), g=None),
            Latent(text="Hi. There.", ids=[1, 6, 7, 2], z=RNG.standard_normal((4, 9)).astype(np.float32),
                   g=RNG.standard_normal((3, 1)).astype(np.float32))]


def test_piper_latents_round_trip(tmp_path):
    lats = _latents()
    got = latents.load(latents.save(tmp_path / "l.npz", lats, source=SOURCE, sample_rate=22050))
    assert got.text == "Hi. There." and got.source == SOURCE and got.sample_rate == 22050
    assert got.ids == [[1, 5, 2], [1, 6, 7, 2]] and got.g[0] is None
    for a, b in zip(got.z, lats):
        np.testing.assert_array_equal(a, b.z)
    np.testing.assert_array_equal(got.g[1], lats[1].g)
    with pytest.raises(InputError, match='holds piper latents inputs, not kokoro inputs.*rkstudy kokoro inputs'):
        kokoro_inputs.load(tmp_path / "l.npz")


def test_unversioned_piper_latents_still_load(tmp_path):
    """The layout before rkstudy.inputs (z_k, g_k, ids_k and JSON metadata as uint8 bytes): a board may
    still hold such files."""
    lats = _latents()
    arrays = {"z_0": lats[0].z, "ids_0": np.asarray(lats[0].ids, np.int64), "z_1": lats[1].z, "g_1": lats[1].g,
              "ids_1": np.asarray(lats[1].ids, np.int64)}
    meta = {"sentences": 2, "text": "Hi. There.", "source": SOURCE, "sample_rate": 16000}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    (tmp_path / "old.npz").write_bytes(buf.getvalue())
    got = latents.load(tmp_path / "old.npz")
    assert got.sample_rate == 16000 and got.source == SOURCE and got.ids == [[1, 5, 2], [1, 6, 7, 2]]
    np.testing.assert_array_equal(got.z[1], lats[1].z)
    assert got.g[0] is None and got.g[1].shape == (3, 1)
    arrays["meta"] = np.frombuffer(b'{"sentences": 3', dtype=np.uint8)
    np.savez(tmp_path / "broken.npz", **arrays)
    with pytest.raises(InputError) as exc:
        latents.load(tmp_path / "broken.npz")
    assert _one_line(exc).startswith("broken.npz is not a latent file written by `rkstudy piper latents`")


def _kokoro(n=(3, 5)):
    sentences = [kokoro_inputs.Sentence(text=f"s{k}", x=RNG.standard_normal((6, f)).astype(np.float32),
                                        har=RNG.standard_normal((2, 60 * f + 1)).astype(np.float32),
                                        style=RNG.standard_normal(4).astype(np.float32),
                                        energy=None if k == 0 else RNG.random(f))
                 for k, f in enumerate(n)]
    head = IstftHead(inverse_basis=RNG.standard_normal((10, 1, 20)).astype(np.float32),
                     window_sum=RNG.random(40).astype(np.float32), n_fft=20, hop=5)
    return kokoro_inputs.Inputs(sentences=sentences, head=head, sample_rate=24000, source=SOURCE)


def test_kokoro_inputs_round_trip_and_shape_check(tmp_path):
    made = _kokoro()
    got = kokoro_inputs.load(kokoro_inputs.save(tmp_path / "k.npz", made))
    assert got.sample_rate == 24000 and got.source == SOURCE and got.frames == 8
    assert [s.text for s in got.sentences] == ["s0", "s1"] and got.sentences[0].energy is None
    np.testing.assert_array_equal(got.sentences[1].har, made.sentences[1].har)
    assert got.sentences[1].energy.dtype == np.float64
    np.testing.assert_array_equal(got.head.inverse_basis, made.head.inverse_basis)
    assert (got.head.n_fft, got.head.hop) == (20, 5)
    made.sentences[1].har = made.sentences[1].har[:, :-1]
    kokoro_inputs.save(tmp_path / "bad.npz", made)
    with pytest.raises(InputError, match="sentence 1 has x .*; they do not describe one latent.*rkstudy kokoro inputs"):
        kokoro_inputs.load(tmp_path / "bad.npz")
