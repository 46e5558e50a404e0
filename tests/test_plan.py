"""The component execution plan read strictly: every rule of the RKNN decoder-path document has a test
here, each bad plan refused in one line that names the key and the fix, with exit 2 and nothing written,
including plans naming an engine for another SoC, another voice or another family, or one whose graph
the host runtimes cannot find."""

import json
import sys
from pathlib import Path

import pytest
from board_cli import STAGE2_BUILD

from rkstudy.cli import main
from rkstudy.contract import Contract, Digest, Tensor, WindowShape
from rkstudy.plan import CPU, NPU, PlanError, resolve, schema, validate

BOARDS = Path(__file__).parent / "fixtures" / "boards"
DECODER = {"impl": "rknn", "artifacts": {"main": "decoder.rknn"}}


def piper(plan):
    return validate(schema("piper"), plan)


def refused(model, plan, *pieces):
    with pytest.raises(PlanError) as err:
        validate(schema(model), plan)
    text = str(err.value)
    assert "\n" not in text and text.startswith((f"{model} plan: ", "--plan")), text
    for piece in pieces:
        assert piece in text, text
    return text


# --- what keeps the CPU path -----------------------------------------------------------------------
@pytest.mark.parametrize("plan", [{}, "{}", {"decoder": {}}, {"decoder": {"impl": "default"}},
                                  {"decoder": {"impl": "onnxruntime", "backend": "cpu"}},
                                  {"duration_flows": {"backend": "cpu"}, "duration_encoder": {"backend": "cpu"}}])
def test_an_empty_plan_an_omitted_component_or_impl_default_keep_the_cpu_path(plan):
    p = piper(plan)
    assert [c.impl for c in p.choices] == [CPU, CPU, CPU] and p.on_npu == []
    assert p.canonical() == {} and p.digest == piper({}).digest


def test_a_plan_names_components_in_the_schemas_order_and_fills_param_defaults():
    p = piper({"decoder": DECODER, "duration_encoder": {"impl": "rknn", "artifacts": {"main": "b.rknn, a.rknn"}}})
    assert [c.component for c in p.choices] == ["duration_encoder", "duration_flows", "decoder"]
    assert p.on_npu == ["duration_encoder", "decoder"]
    assert p["duration_encoder"].artifacts == {"main": ("b.rknn", "a.rknn")}
    # a ladder is a set of rungs: the canonical plan lists them by name
    assert p.canonical_json() == ('{"decoder":{"artifacts":{"main":"decoder.rknn"},"impl":"rknn"},'
                                  '"duration_encoder":{"artifacts":{"main":"a.rknn,b.rknn"},"impl":"rknn"}}')
    k = validate(schema("kokoro"), {"generator": {"impl": "rknn", "artifacts": {"main": "/boards/gen.rknn"}}})
    assert k["generator"].params == {"overlap": 0, "gain": False}
    assert k.canonical()["generator"] == {"impl": NPU, "artifacts": {"main": "gen.rknn"},
                                          "params": {"gain": False, "overlap": 0}}
    same = validate(schema("kokoro"), {"generator": {"impl": "rknn", "artifacts": {"main": "gen.rknn"},
                                                     "params": {"gain": False}}})
    assert same.digest == k.digest and len(k.digest) == 16


# --- every rule a refusal ---------------------------------------------------------------------------
def test_unknown_fields_are_errors():
    refused("piper", {"decoder": {**DECODER, "engine": "x"}}, "decoder has unknown field 'engine'",
            "impl, backend, artifacts, params")


def test_unknown_components_are_errors():
    refused("piper", {"vocoder": DECODER}, "'vocoder' is not a piper component",
            "duration_encoder, duration_flows, decoder")


@pytest.mark.parametrize("impl,pieces", [
    ("ggml", ['decoder.impl "ggml" is not an implementation of decoder', '"onnxruntime", "rknn", "default"',
              "ggml is the RKNN decoder-path document's CPU path"]),
    ("neon", ['decoder.impl "neon"']), (3, ["decoder.impl is 3", "as a string"])])
def test_unsupported_implementations_are_errors(impl, pieces):
    refused("piper", {"decoder": {"impl": impl}}, *pieces)


def test_a_cpu_only_component_has_no_npu_implementation():
    refused("piper", {"duration_flows": {"impl": "rknn"}}, 'duration_flows.impl "rknn"',
            "has no NPU implementation here; omit impl")


def test_unsupported_backends_are_errors():
    refused("piper", {"decoder": {**DECODER, "backend": "cpu"}}, 'decoder.backend "cpu" with impl "rknn"',
            "omit backend")
    refused("piper", {"duration_flows": {"backend": "vulkan"}}, 'duration_flows.backend "vulkan"',
            'runs on "cpu" only')


def test_missing_required_artifacts_are_errors():
    refused("piper", {"decoder": {"impl": "rknn"}}, "decoder.artifacts.main is missing",
            '"artifacts": {"main": "decoder.rknn"}')
    refused("qwen3", {"speech_decoder": {"impl": "rknn", "artifacts": {"first": "b16.rknn"}}},
            "speech_decoder.artifacts.main is missing")


def test_unknown_roles_are_errors_and_the_optional_ones_are_taken():
    refused("qwen3", {"speech_decoder": {"impl": "rknn", "artifacts": {"main": "a.rknn", "second": "b.rknn"}}},
            "speech_decoder.artifacts has unknown role 'second'", "main (required), first, window")
    p = validate(schema("qwen3"), {"speech_decoder": {"impl": "rknn", "artifacts": {
        "main": "b64.rknn", "first": "b16.rknn", "window": "b64.rknn"}}})
    assert sorted(p["speech_decoder"].artifacts) == ["first", "main", "window"]


def test_files_alone_never_select_the_npu():
    refused("piper", {"decoder": {"artifacts": {"main": "decoder.rknn"}}},
            'decoder.artifacts names main without "impl": "rknn"', "files alone never select the NPU")


def test_only_a_ladder_role_takes_several_engines():
    refused("piper", {"decoder": {"impl": "rknn", "artifacts": {"main": "a.rknn,b.rknn"}}},
            "decoder.artifacts.main lists 2 engines, and main takes one",
            "taken by duration_encoder.main")
    refused("piper", {"duration_encoder": {"impl": "rknn", "artifacts": {"main": "a.rknn,,b.rknn"}}},
            "has an empty entry")
    refused("piper", {"duration_encoder": {"impl": "rknn", "artifacts": {"main": "a.rknn,a.rknn"}}},
            "names an engine twice")
    refused("piper", {"decoder": {"impl": "rknn", "artifacts": {"main": ""}}}, "decoder.artifacts.main is \"\"")
    assert validate(schema("cosyvoice3"), {"flow": {"impl": "rknn", "artifacts": {"main": "s250.rknn,s500.rknn"}}}) \
        ["flow"].artifacts["main"] == ("s250.rknn", "s500.rknn")


@pytest.mark.parametrize("params,pieces", [
    ({"window": 3}, ["generator.params 'window' is unsupported", "overlap (integer >= 0, default 0)",
                     "gain (true or false, default false)"]),
    ({"overlap": -1}, ["generator.params.overlap is -1; give an integer >= 0"]),
    ({"overlap": "8"}, ['generator.params.overlap is "8"; give an integer']),
    ({"overlap": True}, ["generator.params.overlap is true; give an integer"]),
    ({"gain": 1}, ["generator.params.gain is 1; give true or false"])])
def test_unsupported_params_are_errors(params, pieces):
    refused("kokoro", {"generator": {"impl": "rknn", "artifacts": {"main": "gen.rknn"}, "params": params}}, *pieces)


def test_the_cpu_path_and_a_component_without_params_take_none():
    refused("kokoro", {"generator": {"params": {"overlap": 4}}}, "generator.params overlap: the onnxruntime path "
            "takes no params")
    refused("piper", {"decoder": {**DECODER, "params": {"overlap": 4}}}, "decoder.params 'overlap' is unsupported",
            "decoder (rknn) takes no params")


@pytest.mark.parametrize("text,pieces", [
    ('{"decoder": ', ["--plan is not JSON (Expecting value at line 1 column 12)"]),
    ("[]", ["--plan is a JSON list, not an object"]),
    ('{"decoder": {}, "decoder": {"impl": "rknn"}}', ["--plan gives 'decoder' twice"]),
    ('{"decoder": 5}', ["piper plan: decoder is 5, not an object"]),
    ('{"decoder": {"impl": "rknn", "artifacts": ["x.rknn"]}}', ["decoder.artifacts is [\"x.rknn\"], not an object"]),
    ("no-such-plan.json", ["--plan 'no-such-plan.json' is neither JSON nor a file"])])
def test_what_is_not_a_plan_object_is_refused(text, pieces):
    refused("piper", text, *pieces)


def test_a_plan_file_is_read_like_the_json_it_holds(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"decoder": DECODER}))
    assert piper(str(path)).on_npu == ["decoder"]
    path.write_text("{oops")
    refused("piper", str(path), f"--plan {path} is not JSON")


def test_an_artifact_name_resolves_in_the_models_folder_else_it_is_a_path(tmp_path, monkeypatch):
    model_dir, elsewhere = tmp_path / "voice", tmp_path / "cwd"
    model_dir.mkdir()
    elsewhere.mkdir()
    (model_dir / "decoder.rknn").write_bytes(b"in the model's folder")
    (elsewhere / "decoder.rknn").write_bytes(b"in the working directory")
    (elsewhere / "enc.rknn").write_bytes(b"only here")
    monkeypatch.chdir(elsewhere)
    p = resolve(piper({"decoder": DECODER, "duration_encoder": {"impl": "rknn", "artifacts": {
        "main": f"enc.rknn,{model_dir / 'decoder.rknn'}"}}}), model_dir)
    assert p["decoder"].path("main") == model_dir / "decoder.rknn"
    assert p["duration_encoder"].paths["main"] == (Path("enc.rknn"), model_dir / "decoder.rknn")
    with pytest.raises(PlanError, match=r"duration_encoder.artifacts.main: no file 'gone.rknn' \(not in .*voice, the "
                                        r"model's folder, either\); give the engine's path"):
        resolve(piper({"duration_encoder": {"impl": "rknn", "artifacts": {"main": "gone.rknn"}}}), model_dir)


# --- through the command line: one line, exit 2, nothing written -------------------------------------
def run(capsys, *argv):
    code = main(["speak", *map(str, argv)])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("plan,piece", [
    ('{"decoder": {"impl": "ggml"}}', 'decoder.impl "ggml" is not an implementation of decoder'),
    ('{"decoder": {"artifacts": {"main": "x.rknn"}}}', "files alone never select the NPU"),
    ('{"decoder": {"impl": "rknn", "artifacts": {"main": "missing.rknn"}}}',
     "decoder.artifacts.main: no file 'missing.rknn'"),
    ('{"flows": {}}', "'flows' is not a piper component")])
def test_a_bad_plan_is_one_line_exit_2_and_nothing_written(capsys, tmp_path, plan, piece):
    code, err = run(capsys, "piper", "--plan", plan, "--runtime", "onnx", "--text", "Hello.", "--audio",
                    tmp_path / "out.wav", "--results", tmp_path / "results")
    assert code == 2 and err.count("\n") == 1 and piece in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_is_not_here_checks_its_plan_then_says_so(capsys, tmp_path):
    code, err = run(capsys, "inflect", "--plan", '{"decoder": {"impl": "rknn", "artifacts": {"main": "x.rknn"}}}')
    assert code == 2 and err.count("\n") == 1
    assert "the plan is valid; the Inflect v2 model is not obtainable here" in err
    code, err = run(capsys, "cosyvoice3", "--plan", '{"flow": {"impl": "rknn"}}')
    assert code == 2 and "flow.artifacts.main is missing" in err


def test_off_a_board_the_runtime_follows_the_artifacts_and_checks_them_first(capsys, tmp_path, voice_files):
    """No --runtime on a host: compiled engines go to the simulator, produced graphs to onnxruntime, said in
    one line; the artifacts are checked before anything runs, and RKNNLite asked for on a host is refused
    only once they pass, naming --runtime."""
    engine = tmp_path / "decoder.rknn"
    engine.write_bytes(b"x")
    code, err = run(capsys, "piper", "--plan", decoder_plan(engine), "--text", "Hello.",
                    "--results", tmp_path / "results")
    assert code == 2 and err.count("\n") == 1
    assert "no contract beside decoder.rknn" in err and "`rkstudy piper decoder --output decoder_z.onnx --target " \
        "rk3588`" in err, err
    assert not (tmp_path / "results").exists()

    from rkstudy.plan.engines import choose_runtime

    assert choose_runtime(None, ["decoder"], ["a/decoder.rknn", "enc_n128.rknn"]) == "simulator"
    assert choose_runtime(None, ["decoder"], ["decoder.rknn", "enc_n128.onnx"]) == "onnx"
    assert choose_runtime(None, [], []) == "rknnlite" and choose_runtime("onnx", ["decoder"], ["d.rknn"]) == "onnx"
    out = capsys.readouterr().out
    assert "no --runtime on this host: decoder run through the PC simulator" in out
    assert "no --runtime on this host: decoder run in onnxruntime, the plan naming produced graphs" in out

    other = fake_engine(tmp_path / "eng", family="piper_encoder", source=voice_files)
    code, err = run(capsys, "piper", "--plan", decoder_plan(other), "--runtime", "rknnlite", "--text", "Hello.",
                    "--voice-onnx", voice_files)
    assert code == 2 and "this is a piper_encoder engine, not a piper_decoder one" in err  # the artifact first
    ours = fake_engine(tmp_path / "ours", source=voice_files)
    code, err = run(capsys, "piper", "--plan", decoder_plan(ours), "--runtime", "rknnlite", "--text", "Hello.",
                    "--voice-onnx", voice_files, "--results", tmp_path / "results")
    assert code == 2 and err.count("\n") == 1
    assert "--runtime rknnlite: the plan puts decoder on the NPU, and this machine has no board" in err
    assert "--runtime simulator" in err and "--runtime onnx" in err
    assert not (tmp_path / "results").exists()


def test_an_audio_file_is_wav_or_flac(capsys, tmp_path):
    code, err = run(capsys, "piper", "--plan", "{}", "--text", "Hello.", "--audio", tmp_path / "out.mp3")
    assert code == 2 and "--audio" in err and "write .wav or .flac" in err


# --- engines that do not fit the run ------------------------------------------------------------------
def fake_engine(folder: Path, *, family="piper_decoder", target="rk3588", source: Path | None = None,
                toolkit="rknn-toolkit2 2.3.2", name="decoder", window=None, params=None, graph=True) -> Path:
    """Engine bytes with a stage-2 contract beside them (and, unless told otherwise, the graph it names),
    as the conversion stage writes them: what the parent checks before any child starts."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path, engine = folder / f"{name}.onnx", folder / f"{name}.rknn"
    onnx_path.write_bytes(b"the stage-1 graph of " + name.encode())
    engine.write_bytes(b"the engine bytes of " + name.encode())
    c = Contract(family=family, stage="decoder", inputs=(Tensor("z", (1, 192, 93), role="walked", axis=2),),
                 outputs=(Tensor("audio", (1, 1, 93 * 256), role="walked", axis=2, rate=256),),
                 source=Digest.of(source) if source else Digest("v.onnx", "a" * 64), window=window,
                 producer=f"rkstudy {family.replace('_', ' ', 1)} --skip-rknn", params=params or {})
    c.compiled(target=target, toolkit=toolkit, onnx_path=onnx_path, engine_path=engine,
               build=STAGE2_BUILD).write_beside(engine)
    if not graph:
        onnx_path.unlink()
    return engine


@pytest.fixture
def board(monkeypatch):
    """A recorded board tree with the replay double of RKNNLite importable, forgotten after."""
    def forget():
        for name in [m for m in sys.modules if m == "rknnlite" or m.startswith("rknnlite.")]:
            del sys.modules[name]

    monkeypatch.syspath_prepend(str(BOARDS.parent.parent / "doubles"))
    forget()
    yield lambda tree: monkeypatch.setenv("RKSTUDY_SYSROOT", str(BOARDS / tree))
    forget()


@pytest.fixture
def voice_files(tmp_path):
    """A voice ONNX and its config standing in for the model (the refusals come before anything reads them)."""
    voice = tmp_path / "voice" / "v.onnx"
    voice.parent.mkdir()
    voice.write_bytes(b"a voice")
    voice.with_suffix(".onnx.json").write_text("{}")
    return voice


def decoder_plan(engine: Path) -> str:
    return json.dumps({"decoder": {"impl": "rknn", "artifacts": {"main": str(engine)}}})


def test_an_engine_compiled_for_another_soc_is_refused_on_the_board(board, capsys, tmp_path, voice_files):
    board("rk3566")
    engine = fake_engine(tmp_path / "eng", source=voice_files)
    code, err = run(capsys, "piper", "--plan", decoder_plan(engine), "--text", "Hello.", "--voice-onnx", voice_files,
                    "--results", tmp_path / "results")
    assert code == 2 and err.count("\n") == 1
    assert "this engine was compiled for rk3588 and this board is rk3566" in err
    assert "`rkstudy piper decoder --onnx <decoder.onnx> --target rk3566`" in err
    assert not (tmp_path / "results").exists()


def test_an_engine_from_a_toolkit_newer_than_the_boards_runtime_is_refused(board, capsys, tmp_path, voice_files):
    """The recorded RK3588 tree's librknnrt is 2.3.2: an engine from rknn-toolkit2 2.5.0 is refused before any
    init, naming both versions and both fixes; the same engine from 2.3.2 passes that check."""
    board("rk3588")
    plan = {"decoder": {"impl": "rknn", "artifacts": {"main": str(fake_engine(tmp_path / "new", source=voice_files,
                                                                               toolkit="rknn-toolkit2 2.5.0"))}}}
    code, err = run(capsys, "piper", "--plan", json.dumps(plan), "--text", "Hello.", "--voice-onnx", voice_files,
                    "--results", tmp_path / "results")
    assert code == 2 and err.count("\n") == 1
    assert "decoder.rknn is from rknn-toolkit2 2.5.0 and this board's librknnrt 2.3.2 is older: Rockchip upgrades " \
           "librknnrt with the toolkit, release for release" in err and "Fix: put librknnrt 2.5.0 in /usr/lib" in err
    assert not (tmp_path / "results").exists()
    from rkstudy.plan import engines

    ok = fake_engine(tmp_path / "old", source=voice_files, toolkit="rknn-toolkit2 2.3.2")
    assert engines.load(ok, family="piper_decoder", runtime="rknnlite", source=voice_files).contract.toolkit == \
        "rknn-toolkit2 2.3.2"


def test_an_engine_of_another_voice_is_refused(board, capsys, tmp_path, voice_files):
    board("rk3588")
    engine = fake_engine(tmp_path / "eng")  # made from "v.onnx" of digest aaaa...
    code, err = run(capsys, "piper", "--plan", decoder_plan(engine), "--text", "Hello.", "--voice-onnx", voice_files)
    assert code == 2 and err.count("\n") == 1
    assert "v.onnx (sha256 " in err
    assert "is not the model this engine was made from (v.onnx, sha256 aaaaaaaaaaaa)" in err


def test_an_engine_of_another_family_is_refused(capsys, tmp_path, voice_files):
    engine = fake_engine(tmp_path / "eng", family="piper_encoder", source=voice_files)
    code, err = run(capsys, "piper", "--plan", decoder_plan(engine), "--runtime", "onnx", "--text", "Hello.",
                    "--voice-onnx", voice_files)
    assert code == 2 and "this is a piper_encoder engine, not a piper_decoder one" in err


def test_the_host_runtimes_need_the_graph_the_engine_was_compiled_from(capsys, tmp_path, voice_files):
    engine = fake_engine(tmp_path / "eng", source=voice_files, graph=False)
    code, err = run(capsys, "piper", "--plan", decoder_plan(engine), "--runtime", "onnx", "--text", "Hello.",
                    "--voice-onnx", voice_files)
    assert code == 2 and err.count("\n") == 1
    assert "run the graph decoder.rknn was compiled from, decoder.onnx, and it is not beside the engine" in err
    (tmp_path / "eng" / "decoder.onnx").write_bytes(b"another graph")
    code, err = run(capsys, "piper", "--plan", decoder_plan(engine), "--runtime", "simulator", "--text", "Hello.",
                    "--voice-onnx", voice_files)
    assert code == 2 and "decoder.onnx beside decoder.rknn is not the graph the engine was compiled from" in err


def test_a_host_runtime_on_a_board_is_refused(board, capsys, tmp_path):
    board("rk3588")
    code, err = run(capsys, "piper", "--plan", "{}", "--runtime", "simulator", "--text", "Hello.")
    assert code == 2 and "--runtime simulator is a host runtime" in err and "omit --runtime" in err


def test_kokoros_overlap_is_bounded_by_the_engines_emitted_window(capsys, tmp_path):
    model = tmp_path / "model" / "kokoro-v1.0.int8.onnx"
    model.parent.mkdir()
    model.write_bytes(b"the int8 model")
    engine = fake_engine(model.parent, family="kokoro_generator", source=model, name="gen",
                         window=WindowShape(frames=128, emit=72, context=28, hop=72))
    plan = {"generator": {"impl": "rknn", "artifacts": {"main": "gen.rknn"}, "params": {"overlap": 37}}}
    code, err = run(capsys, "kokoro", "--plan", json.dumps(plan), "--runtime", "onnx", "--model", model,
                    "--text", "今日は。")
    assert code == 2 and err.count("\n") == 1
    assert "kokoro plan: generator.params.overlap is 37; gen.rknn emits 72 frames a window, so give 0..36" in err
    assert engine.is_file()


def test_a_produced_graph_is_an_artifact_on_the_host_and_refused_on_a_board(board, capsys, tmp_path, voice_files):
    from rkstudy import graph
    from rkstudy.contract import METADATA_KEY
    from rkstudy.toolkit.probes import vocoder_probe

    c = Contract(family="piper_decoder", stage="decoder", inputs=(Tensor("z", (1, 192, 93), role="walked", axis=2),),
                 outputs=(Tensor("audio", (1, 1, 93 * 256), role="walked", axis=2, rate=256),),
                 source=Digest.of(voice_files), producer="rkstudy piper decoder --skip-rknn --output decoder_z.onnx")
    produced = tmp_path / "decoder_z.onnx"
    produced.write_bytes(graph.with_metadata(vocoder_probe(), **{METADATA_KEY: c.to_json()}).SerializeToString())
    from rkstudy.plan import engines

    loaded = engines.load(produced, family="piper_decoder", runtime="onnx", source=voice_files)
    assert loaded.graph == produced and loaded.label.startswith("decoder_z.onnx:")
    with pytest.raises(Exception, match="this is a piper_decoder engine, not a piper_encoder one"):
        engines.load(produced, family="piper_encoder", runtime="onnx")
    board("rk3588")
    code, err = run(capsys, "piper", "--plan", decoder_plan(produced), "--text", "Hello.", "--voice-onnx", voice_files)
    assert code == 2 and err.count("\n") == 1
    assert "decoder_z.onnx is a produced graph, not an engine: the NPU runs engines; convert it with " \
           "`rkstudy piper decoder --onnx <decoder_z.onnx> --target rk3588` on the host" in err


def test_a_table_this_user_cannot_write_is_refused_before_the_synthesis(capsys, tmp_path, monkeypatch):
    """An earlier run under sudo left the table root-owned: said before the child starts, nothing written."""
    from rkstudy.board import run as board_run

    table = tmp_path / "results" / "piper_decoder" / "speak.csv"
    table.parent.mkdir(parents=True)
    table.write_text("model\npiper\n")
    monkeypatch.setattr(board_run.os, "access", lambda path, mode: str(path) != str(table))
    code, err = run(capsys, "piper", "--plan", "{}", "--text", "Hello.", "--audio", tmp_path / "out.wav",
                    "--results", tmp_path / "results")
    assert code == 2 and err.count("\n") == 1 and "speak.csv is not writable by this user" in err
    assert not (tmp_path / "out.wav").exists() and table.read_text() == "model\npiper\n"
