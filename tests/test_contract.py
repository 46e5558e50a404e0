"""The versioned stage contract: round trip, and every refusal at load with the command that fixes it."""

import json
from dataclasses import replace

import pytest

from rkstudy import contract, targets
from rkstudy.contract import Contract, Digest, Tensor, WindowShape
from rkstudy.errors import EngineMismatch

PRODUCER = "rkstudy piper decoder --voice-onnx v.onnx --skip-rknn --output decoder_z.onnx"


def decoder(**kw) -> Contract:
    c = Contract(family="piper_decoder", stage="decoder",
                 inputs=(Tensor("z", (1, 192, 93), role="walked", axis=2),
                         Tensor("y_mask", (1, 1, 93), role="mask", axis=2)),
                 outputs=(Tensor("audio", (1, 1, 93 * 256), role="walked", axis=2, rate=256),),
                 source=Digest("v.onnx", "a" * 64), producer=PRODUCER, params={"hop": 256},
                 window=WindowShape(frames=93, emit=45, context=24, hop=45))
    return replace(c, **kw)


def kokoro_like() -> Contract:
    """Two walked inputs at different rates (the latent at 1/frame, har at 60/frame + 1)."""
    return Contract(family="kokoro_generator", stage="generator",
                    inputs=(Tensor("x", (1, 512, 128), role="walked", axis=2),
                            Tensor("har", (1, 22, 60 * 128 + 1), role="walked", axis=2, rate=60, extra=1),
                            Tensor("s", (1, 128), role="constant")),
                    outputs=(Tensor("spec", (1, 22, 60 * 128 + 1), role="walked", axis=2, rate=60, extra=1),),
                    source=Digest("k.onnx", "b" * 64), producer="rkstudy kokoro generator --frames 128",
                    window=WindowShape(128, 72, 28, 72))


def stateful() -> Contract:
    return Contract(family="qwen3_vocoder", stage="vocoder",
                    inputs=(Tensor("codes", (1, 16, 64)), Tensor("cache_in", (1, 1303424), role="state")),
                    outputs=(Tensor("audio", (1, 1, 122880)), Tensor("cache_out", (1, 1303424), role="state")),
                    source=Digest("q.safetensors", "c" * 64), producer="rkstudy qwen3 vocoder --codes-length 64",
                    state=(("cache_in", "cache_out"),))


@pytest.mark.parametrize("make", [decoder, kokoro_like, stateful])
def test_round_trip(make):
    c = make()
    assert contract.from_json(c.to_json(), where="t") == c
    assert c.tensor(c.inputs[0].name).frames == (c.inputs[0].frames)


def test_rates_and_frames():
    k = kokoro_like()
    assert [t.frames for t in k.inputs] == [128, 128, None]
    assert k.tensor("spec").frames == 128


def mutate(change) -> str:
    d = json.loads(decoder().to_json())
    change(d)
    return json.dumps(d)


REFUSALS = [
    ("missing field", lambda d: d.pop("window"), "the contract has no window"),
    ("unknown field", lambda d: d.update(colour="blue"), "unknown field(s) colour"),
    ("other schema", lambda d: d.update(schema=2), "schema version 2 and this rkstudy reads 1"),
    ("no schema", lambda d: d.pop("schema"), "schema version None"),
    ("bad role", lambda d: d["inputs"][0].update(role="magic"), "role 'magic'"),
    ("walked without axis", lambda d: d["inputs"][0].update(axis=None), "no valid frame axis"),
    ("bad window", lambda d: d["window"].update(frames=90), "frames = emit + 2 x context"),
    ("rate mismatch", lambda d: d["outputs"][0].update(shape=[1, 1, 1000]), "is not 256 x frames"),
    ("bad state", lambda d: d.update(state=[{"input": "z", "output": "nope"}]), "which are not an input and an output"),
    ("tensor field", lambda d: d["inputs"][0].pop("dtype"), "input 0 has no dtype"),
]


@pytest.mark.parametrize("what,change,fragment", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_at_load_naming_the_producer(what, change, fragment):
    with pytest.raises(EngineMismatch, match="make a matching one with `rkstudy piper decoder") as exc:
        contract.from_json(mutate(change), where="t")
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_state_tensors_are_paired_once_input_to_output():
    d = json.loads(stateful().to_json())
    d["state"] = []
    with pytest.raises(EngineMismatch, match="state tensor.s. cache_in, cache_out are not paired once"):
        contract.from_dict(d)
    d["state"] = [{"input": "cache_in", "output": "cache_out"}] * 2
    with pytest.raises(EngineMismatch, match="named twice"):
        contract.from_dict(d)


def test_a_stage_made_by_a_flag_of_another_command_converts_there():
    """The stateful step is `rkstudy piper decoder --stateful`: stage 2 is `rkstudy piper decoder --onnx`,
    and a board job can name its own producer when it refuses an engine of another family."""
    step = replace(stateful(), family="piper_decoder_stateful", producer="rkstudy piper decoder --stateful --emit 45")
    assert step.remake_engine("rk3566").startswith("rkstudy piper decoder --onnx <slice.onnx> --target rk3566")
    with pytest.raises(EngineMismatch, match="make a piper_decoder_stateful engine with `rkstudy piper decoder --st"):
        decoder().check_family("piper_decoder_stateful", "rkstudy piper decoder --stateful --help")


def test_not_json_at_all():
    with pytest.raises(EngineMismatch, match="is not valid JSON"):
        contract.from_json("{nope", where="x.contract.json")


@pytest.fixture
def engine(tmp_path):
    """A compiled-looking engine: bytes plus a stage-2 contract beside them."""
    source = tmp_path / "voice.onnx"
    source.write_bytes(b"the voice")
    slice_ = tmp_path / "decoder_z.onnx"
    slice_.write_bytes(b"the slice")
    path = tmp_path / "decoder.rknn"
    path.write_bytes(b"the engine bytes")
    c = decoder(source=Digest.of(source)).compiled(target="rk3588", toolkit="rknn-toolkit2 2.5.0",
                                                   onnx_path=slice_, engine_path=path)
    c.write_beside(path)
    return path, source, c


def test_an_engine_loads_with_every_check_passing(engine):
    path, source, c = engine
    assert contract.for_engine(path, family="piper_decoder", soc="rk3588", source=source) == c
    assert c.engine_name("rk3588", "0123abcd") == "piper_decoder-w93-rk3588-0123abcd.rknn"


def test_changed_engine_bytes_are_refused(engine):
    path, _, _ = engine
    path.write_bytes(b"the engine bytes, edited")
    with pytest.raises(EngineMismatch, match="has changed since it was converted .* `rkstudy piper decoder --onnx"):
        contract.for_engine(path)


def test_another_soc_is_refused(engine):
    path, _, _ = engine
    with pytest.raises(EngineMismatch, match="compiled for rk3588 and this board is rk3566; .* --target rk3566"):
        contract.for_engine(path, soc="rk3566")


def test_another_source_model_is_refused(engine, tmp_path):
    path, _, _ = engine
    other = tmp_path / "other.onnx"
    other.write_bytes(b"another voice")
    with pytest.raises(EngineMismatch, match="other.onnx .* is not the model this engine was made from .*voice.onnx"):
        contract.for_engine(path, source=other)


def test_another_family_and_a_missing_contract_are_refused(engine):
    path, _, _ = engine
    with pytest.raises(EngineMismatch, match="this is a piper_decoder engine, not a piper_encoder one"):
        contract.for_engine(path, family="piper_encoder")
    with pytest.raises(EngineMismatch) as refused:
        contract.for_engine(path, family="piper_encoder")
    # the fix is the encoder family's own command for the engine's SoC, not a pointer at --help
    assert str(refused.value).endswith("make a piper_encoder engine with `rkstudy piper encoder --frames 128 "
                                       "--output enc_n128.onnx --target rk3588`")
    contract.beside(path).unlink()
    with pytest.raises(EngineMismatch, match="no contract beside decoder.rknn"):
        contract.for_engine(path, family="piper_decoder")
    path.write_bytes(b"")
    with pytest.raises(EngineMismatch) as refused:
        contract.for_engine(path, family="piper_decoder", soc="rk3566")
    assert str(refused.value) == (f"{path} is empty (0 bytes): a copy or a build that did not finish; make it again "
                                  "with `rkstudy piper decoder --output decoder_z.onnx --target rk3566`")


def test_a_stage1_contract_beside_an_engine_is_refused(tmp_path):
    path = tmp_path / "e.rknn"
    path.write_bytes(b"x")
    decoder().write_beside(path)
    with pytest.raises(EngineMismatch, match="stage-1 contract"):
        contract.for_engine(path)


def test_board_soc_from_the_device_tree(monkeypatch, tmp_path):
    from rkstudy.board import sysfs
    from rkstudy.paths import REPO

    boards = REPO / "tests" / "fixtures" / "boards"
    for name, soc in (("rk3588", "rk3588"), ("rk3566", "rk3566"), ("rk3566-orangepi-3b", "rk3566"),
                      ("rk3576", "rk3576")):
        monkeypatch.setenv("RKSTUDY_SYSROOT", str(boards / name))
        assert sysfs.soc() == soc
    for compatible, soc in ((b"radxa,rock-5a\0rockchip,rk3588s\0", "rk3588"),
                            (b"rockchip,rk3568-evb1\0rockchip,rk3568\0", "rk3568"),
                            (b"rockchip,rk3562-evb\0rockchip,rk3562\0", "rk3562"),
                            (b"pine64,rockpro64\0rockchip,rk3399\0", "rk3399"), (b"raspberrypi,5-model-b\0", None)):
        tree = tmp_path / compatible.decode().split(",")[-1].strip("\0")
        (tree / "proc/device-tree").mkdir(parents=True)
        (tree / "proc/device-tree/compatible").write_bytes(compatible)
        monkeypatch.setenv("RKSTUDY_SYSROOT", str(tree))
        assert sysfs.soc() == soc, compatible
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(boards / "nowhere"))
    assert sysfs.soc() is None


def test_every_soc_is_checked_and_the_same_npu_runs_the_same_engine(engine, tmp_path):
    path, _, c = engine
    assert targets.TARGETS == ("rk3588", "rk3566", "rk3568", "rk3576", "rk3562", "rv1103", "rv1106")
    with pytest.raises(EngineMismatch, match="compiled for rk3588 and this board is rk3576; .* --target rk3576"):
        contract.for_engine(path, soc="rk3576")
    with pytest.raises(EngineMismatch, match="compiled for rk3588 and this board is rk3399, which rknn-toolkit2 "
                                             "does not build for"):
        contract.for_engine(path, soc="rk3399")
    rk3566 = replace(c, target="rk3566")
    rk3566.check_target("rk3568")  # one NPU: an rk3566 engine runs on an rk3568
    rk3566.check_target("rk3566")
    with pytest.raises(EngineMismatch, match="compiled for rk3566 and this board is rk3562"):
        rk3566.check_target("rk3562")


def test_an_rk3588_engine_is_refused_on_the_recorded_rk3576_board(engine, monkeypatch):
    from rkstudy.board import sysfs
    from rkstudy.paths import REPO

    path, _, _ = engine
    monkeypatch.setenv("RKSTUDY_SYSROOT", str(REPO / "tests" / "fixtures" / "boards" / "rk3576"))
    with pytest.raises(EngineMismatch, match=r"compiled for rk3588 and this board is rk3576; convert the graph "
                                             r"for it with `rkstudy piper decoder --onnx <decoder_z.onnx> "
                                             r"--target rk3576`"):
        contract.for_engine(path, family="piper_decoder", soc=sysfs.soc())


def test_the_register_field_is_recorded_for_every_target():
    assert [t.name for t in targets.RECORDS] == list(targets.TARGETS)
    assert {t.name: t.register_field_bits for t in targets.RECORDS} == {
        "rk3588": None, "rk3566": None, "rk3568": None, "rk3576": 14, "rk3562": None, "rv1103": None, "rv1106": None}


class FakeRunner:
    """A runner as the walkers see it: input names and (possibly dynamic) shapes."""

    def __init__(self, input_names, shapes=None):
        self.input_names, self.shapes = input_names, shapes


def test_check_runner_takes_a_matching_runner_and_one_that_says_nothing():
    c = decoder()
    c.check_runner(FakeRunner(["z", "y_mask"], {"z": (1, 192, 93), "y_mask": (1, 1, 93)}))
    c.check_runner(FakeRunner(["z", "y_mask"], {"z": ("batch", 192, 93), "y_mask": None}))  # dynamic: not checked
    c.check_runner(object())  # no names, no shapes: taken at its word


def test_check_runner_refuses_other_inputs_naming_the_producer():
    with pytest.raises(EngineMismatch, match=r"the engine takes inputs \['y_mask', 'z'\] but its contract lists "
                                             r"\['z', 'y_mask'\]; make a matching one with `rkstudy piper decoder"):
        decoder().check_runner(FakeRunner(["y_mask", "z"]))


def test_check_runner_refuses_another_static_shape_naming_the_producer():
    with pytest.raises(EngineMismatch, match=r"the engine's y_mask is \(1, 1, 45\) but its contract says "
                                             r"\(1, 1, 93\); make a matching one with `rkstudy piper decoder"):
        decoder().check_runner(FakeRunner(["z", "y_mask"], {"z": (1, 192, 93), "y_mask": (1, 1, 45)}))


def test_check_params_passes_a_matching_model_and_reads_an_absent_param_as_its_default():
    c = decoder(params={"hop": 256, "channels": 192})
    c.check_params({"hop": 256, "channels": 192, "speaker_dims": contract.Expect(0, absent=0)}, what="voice")
    c.check_params({"hop": ...}, what="voice")  # present, any value


def test_check_params_lists_every_mismatch_in_one_refusal_naming_the_producer():
    c = decoder(params={"hop": 256, "channels": 192})
    with pytest.raises(EngineMismatch) as err:
        c.check_params({"hop": 512, "channels": contract.Expect(256, "the engine takes {engine} channels, the "
                                                                     "{what} has {model}"),
                        "speaker_dims": contract.Expect(64, absent=0)}, what="voice")
    assert str(err.value) == ("the engine's hop is 256, the voice has 512; the engine takes 192 channels, the voice "
                              "has 256; the engine's speaker_dims is 0, the voice has 64. Produce an engine for this "
                              f"voice with `{PRODUCER}`")


def test_check_params_refuses_a_missing_param_first_and_compares_a_missing_value_as_none():
    c = decoder(params={"hop": 256})
    with pytest.raises(EngineMismatch) as err:
        c.check_params({"channels": 192, "cache_numel": ..., "codes_length": ..., "hop": ...}, what="step")
    assert str(err.value) == ("the piper_decoder contract's params have no cache_numel, codes_length; the engine's "
                              f"channels is None, the step has 192. Produce an engine for this step with `{PRODUCER}`")


def test_a_quantized_engine_records_what_it_computes_in(tmp_path):
    """A quantized engine's contract carries the toolkit's dtype, calibration algorithm and method, the
    build's label and how many tensors a hybrid kept in float16, and reads back as written; an fp16
    contract writes no such field (its bytes stay as they were), and an undocumented dtype is refused."""
    (tmp_path / "slice.onnx").write_bytes(b"the slice")
    (tmp_path / "q.rknn").write_bytes(b"the quantized engine")
    record = {"dtype": "w8a8", "algorithm": "kl_divergence", "method": "channel",
              "label": "int8 w8a8 kl_divergence hybrid (12 layers fp16)", "calibration_samples": 16,
              "fp16_tensors": 12}
    c = decoder().compiled(target="rk3588", toolkit="rknn-toolkit2 2.5.0", onnx_path=tmp_path / "slice.onnx",
                           engine_path=tmp_path / "q.rknn", quantization=record)
    c.write_beside(tmp_path / "q.rknn")
    back = contract.for_engine(tmp_path / "q.rknn", family="piper_decoder", soc="rk3588")
    assert back == c and back.quantization == record and back.dtype == record["label"]
    fp16 = decoder().compiled(target="rk3588", toolkit="rknn-toolkit2 2.5.0", onnx_path=tmp_path / "slice.onnx",
                              engine_path=tmp_path / "q.rknn")
    assert fp16.dtype == "fp16" and "quantization" not in fp16.to_dict()
    with pytest.raises(EngineMismatch, match="quantization dtype is 'w8a4'; known: w8a8, w8a16"):
        contract.from_json(json.dumps({**c.to_dict(), "quantization": {**record, "dtype": "w8a4"}}), where="x")
    with pytest.raises(EngineMismatch, match="quantization has no fp16_tensors"):
        contract.from_json(json.dumps({**c.to_dict(), "quantization": {k: v for k, v in record.items()
                                                                      if k != "fp16_tensors"}}), where="x")
