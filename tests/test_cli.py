"""The command line: one parametrized table of argv -> exit code -> message, and the happy paths."""

import importlib
import json
import pkgutil
import re
from pathlib import Path

import onnx
import pytest

from rkstudy import graph
from rkstudy.cli import main, parse_shapes
from rkstudy.errors import UsageError
from rkstudy.toolkit import cost, envs
from rkstudy.toolkit.probes import long_axis_probe, vocoder_probe


def test_parse_shapes():
    assert parse_shapes(["z:1,192,93", "y_mask:1,1,93"]) == {"z": [1, 192, 93], "y_mask": [1, 1, 93]}
    assert parse_shapes(["/enc/Add_output_0:1,2"]) == {"/enc/Add_output_0": [1, 2]}
    with pytest.raises(UsageError, match="NAME:D0,D1"):
        parse_shapes(["z=1,192"])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    good = d / "probe.onnx"
    onnx.save(vocoder_probe(), str(good))
    data = good.read_bytes()
    (d / "empty.onnx").write_bytes(b"")
    (d / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (d / "corrupt.onnx").write_bytes(b"\x08\x07this is not an onnx model at all\xff\xfe" * 40)
    onnx.save(long_axis_probe(32768), str(d / "long.onnx"))  # overflows the 13-bit field on rk3588
    (d / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
    (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    return d


def run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses bad usage itself
        code = exc.code
    return code, capsys.readouterr().err


ERRORS = [
    (["census", "{d}/missing.onnx"], 2, "no ONNX model at"),
    (["census", "{d}/empty.onnx"], 2, "is empty (0 bytes): not an ONNX model"),
    (["census", "{d}/truncated.onnx"], 2, "is not a readable ONNX model (truncated or corrupt"),
    (["census", "{d}/corrupt.onnx"], 2, "not a readable ONNX model"),
    (["fold", "{d}/corrupt.onnx", "--shape", "x:1,16,1,64", "-o", "{d}/o.onnx"], 2, "not a readable ONNX model"),
    (["build", "{d}/truncated.onnx"], 2, "is not a readable ONNX model"),
    (["piper", "decoder", "--onnx", "{d}/corrupt.onnx"], 2, "not a readable ONNX model"),
    (["piper", "decoder", "--onnx", "{d}/probe.onnx"], 2, "carries no stage contract; produce it with"),
    (["fold", "{d}/probe.onnx", "--shape", "nosuch:1,4,93", "-o", "{d}/o.onnx"], 2,
     "no graph input named nosuch; inputs are x"),
    (["build", "{d}/probe.onnx", "--shape", "x:1,16,,64"], 2, "expected NAME:D0,D1"),
    (["build", "{d}/probe.onnx", "--shape", "x=1,16"], 2, "expected NAME:D0,D1"),
    (["piper", "encoder", "--frames", "0", "--skip-rknn"], 2, "0 is not a positive integer"),
    (["piper", "encoder", "--frames", "-3", "--skip-rknn"], 2, "-3 is not a positive integer"),
    (["piper", "decoder", "--emit", "0", "--skip-rknn"], 2, "0 is not a positive integer"),
    (["build", "{d}/probe.onnx", "--target", "rk3399"], 2, "invalid choice: 'rk3399'"),
    (["piper", "decoder", "--onnx", "{d}/probe.onnx", "--emit", "45"], 2, "--emit belong to stage 1"),
    (["piper", "encoder", "--onnx", "{d}/probe.onnx", "--frames", "64"], 2, "--frames belong to stage 1"),
    (["piper", "encoder", "--onnx", "{d}/probe.onnx", "--relshift", "banded"], 2, "--relshift belong to stage 1"),
    (["piper", "encoder", "--frames", "64", "--relshift", "diagonal"], 2, "invalid choice: 'diagonal'"),
    (["piper", "decoder", "--skip-rknn", "--out", "{d}/e.rknn"], 2,
     "--out names the engine, and --skip-rknn builds none"),
    (["inflect", "decoder", "--carve", "--decode-onnx", "{d}/probe.onnx"], 2, "--carve writes a decode.onnx"),
    (["piper", "encoder", "--skip-rknn"], 2, "give --frames N"),
    (["board", "run", "piper_decoder", "--engine", "{d}/e.rknn", "--latents", "{d}/l.npz"], 2,
     "`rkstudy board run` runs on an RKNPU2 board (RK3588, RK3576, RK3566/RK3568, RK3562)"),
    (["piper", "decoder", "--voice-onnx", "{d}/none.onnx", "--skip-rknn"], 2, "no voice ONNX at"),
    (["nosuch"], 2, "invalid choice: 'nosuch'"),
    (["piper", "latents", "--text", "", "-o", "{d}/said.npz"], 2, "--text is empty; give the text to speak"),
    (["piper", "latents", "--text", " \n ", "-o", "{d}/said.npz"], 2, "--text is empty; give the text to speak"),
    (["piper", "latents", "--text-file", "{d}/blank.txt", "-o", "{d}/said.npz"], 2, "blank.txt holds no text"),
    (["piper", "latents", "--text-file", "{d}/none.txt", "-o", "{d}/said.npz"], 2, "no text file at"),
    (["piper", "latents", "--text-file", "{d}/latin1.txt", "-o", "{d}/said.npz"], 2, "latin1.txt is not UTF-8 text"),
    (["kokoro", "inputs", "--text", "", "-o", "{d}/said.npz"], 2, "--text is empty; give the text to speak"),
    (["kokoro", "inputs", "--text-file", "{d}/blank.txt", "-o", "{d}/said.npz"], 2, "blank.txt holds no text"),
    (["piper", "encoder", "--frames", "100000", "--skip-rknn"], 2, "GB available; the widest that fits is --frames"),
]


@pytest.mark.parametrize("argv,code,fragment", ERRORS,
                         ids=[" ".join(a[:3]) + f" [{i}]" for i, (a, _, _) in enumerate(ERRORS)])
def test_error_table(files, capsys, argv, code, fragment):
    got, err = run([a.format(d=files) for a in argv], capsys)
    assert got == code
    assert fragment in err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line, no traceback
    assert not (files / "said.npz").exists()  # refused input writes nothing


def test_an_encoder_width_that_cannot_fit_is_refused_naming_the_widest_that_does(capsys, monkeypatch):
    from rkstudy.families.piper_encoder import producer

    monkeypatch.setattr(producer, "available_memory", lambda: 8e9)
    widest = int(((8e9 - producer.STAGE1_BASE_BYTES) / producer.STAGE1_BYTES_PER_N2["gather"]) ** 0.5)
    assert widest == 1292  # 0.65 GB + 4.4 kB * N^2 <= 8 GB
    producer.refuse_what_cannot_fit(widest)  # the width it names is admitted
    code, err = run(["piper", "encoder", "--frames", str(widest + 1), "--skip-rknn"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "needs about 8 GB at that width and this machine has 8.0 GB available; the widest that fits is " \
           "--frames 1292" in err
    banded = producer.stage1_peak_bytes(4096, "banded")
    assert banded == pytest.approx(0.65e9 + 800 * 4096**2)  # 14 GB: far less than gather, still too much
    with pytest.raises(UsageError, match="the widest that fits is --frames 3031"):
        producer.refuse_what_cannot_fit(4096, "banded")


def test_a_missing_toolkit_names_make_toolkit(files, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(envs, "toolkit_available", lambda: False)
    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path))  # an engine another test built would answer without a toolkit
    code, err = run(["build", str(files / "probe.onnx")], capsys)
    assert code == 2 and "run `make toolkit`" in err and err.count("\n") == 1


@pytest.mark.simulator
def test_a_failed_gate_or_build_exits_1(files, capsys):
    code, err = run(["build", str(files / "long.onnx"), "--regtask-limit", "1", "--rebuild",
                     "--out", str(files / "long.rknn")], capsys)
    assert code == 1 and "regtask-limit" in err and err.count("\n") == 1


def test_debug_shows_the_traceback(files):
    with pytest.raises(Exception, match="is empty"):
        main(["--debug", "census", str(files / "empty.onnx")])


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("rkstudy 0.")


@pytest.mark.simulator
def test_fold_then_build_from_the_command_line(dynamic_model, tmp_path, capsys):
    src, folded, engine = tmp_path / "dyn.onnx", tmp_path / "folded.onnx", tmp_path / "e.rknn"
    onnx.save(dynamic_model, str(src))
    assert main(["fold", str(src), "--shape", "x:1,4,93", "-o", str(folded)]) == 0
    assert "Shape 1 -> 0, ConstantOfShape 1 -> 0" in capsys.readouterr().out
    assert graph.input_shapes(folded) == {"x": (1, 4, 93)}
    assert main(["build", str(folded), "--target", "rk3566", "--out", str(engine)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "ok" and report["target"] == "rk3566" and engine.exists()
    assert report["converter_peak_mb"] > 50  # the toolkit child's own peak (its VmHWM), not the caller's
    assert main(["census", str(folded)]) == 0
    census = json.loads(capsys.readouterr().out)
    assert census["Shape"] == 0 and census["longest_axis"] == 93


STAGE2_ROW = {"status": "ok", "target": "rk3566", "dtype": "fp16", "regtask": 18, "regtask_max_value": 8309,
              "engine_mb": 12.345, "build_s": 41.2, "converter_peak_mb": 2150.4, "engine": "/e/dec.rknn",
              "engine_bytes": 12_345_678, "contract": "/e/dec.contract.json", "gate": "simulator_vs_fp32_white_noise",
              "measured": 31.26, "threshold": 15.0, "unit": "dB", "passed": True, "probed_on": "a white-noise window",
              "board_risk": "at risk: 18 REGTASK lines, largest field value 8,309 (field limit 8,191): the simulator "
                            "does not model the overflow",
              "npu_ms_predicted": "", "npu_ms_conv": "", "npu_ms_dram": "", "npu_ms_elementwise": "",
              "npu_ms_dispatch": "", "npu_ms_cpu": "", "npu_ms_io": "", "npu_soc": "rk3566",
              "npu_cost_note": "cannot speak for rk3566: no DRAM bandwidth (no DRAM figure for this SoC here: measure "
                               "one with `rkstudy board dram` on a board)"}


def test_stage2_says_what_it_built_in_one_line():
    from rkstudy.cliutil import summary_line

    assert summary_line(STAGE2_ROW) == (
        "/e/dec.rknn: rk3566 fp16, 12,345,678 bytes, REGTASK 18 lines (largest value 8309), built in 41.2 s, "
        "converter peak 2,150 MB; simulator vs fp32 on a white-noise window: 31.3 dB >= 15 "
        "(gate simulator_vs_fp32_white_noise); board risk: at risk: 18 REGTASK lines, largest field value 8,309 "
        "(field limit 8,191): the simulator does not model the overflow; NPU time per call: cannot speak for rk3566: "
        "no DRAM bandwidth (no DRAM figure for this SoC here: measure one with `rkstudy board dram` on a board); "
        "contract dec.contract.json")
    predicted = {**STAGE2_ROW, "target": "rk3588", "npu_soc": "rk3588", "npu_ms_predicted": 31.2, "npu_ms_conv": 8.19,
                 "npu_ms_dram": 6.1, "npu_ms_elementwise": 12.0, "npu_ms_dispatch": 0.0, "npu_ms_cpu": 2.5,
                 "npu_ms_io": 2.41}
    assert summary_line(predicted).endswith(
        "; the NPU cost model predicts 31.2 ms per call on rk3588 (conv 8.19, dram 6.1, elementwise 12, dispatch 0, "
        "cpu 2.5, io 2.41 ms; a prediction from the compiler's layer table, not a board number); "
        "contract dec.contract.json")


@pytest.mark.simulator
def test_stage2_prints_the_summary_line_and_json_gives_the_row(tmp_path, capsys):
    step, engine = tmp_path / "b4.onnx", tmp_path / "b4.rknn"
    assert main(["qwen3", "vocoder", "--codes-length", "4", "--widths", "tiny", "--skip-rknn",
                 "--output", str(step)]) == 0
    capsys.readouterr()
    assert main(["qwen3", "vocoder", "--onnx", str(step), "--out", str(engine)]) == 0
    described, summary = capsys.readouterr().out.splitlines()
    assert described.startswith("b4.onnx: qwen3_vocoder, step of 4 tokens")
    m = re.fullmatch(re.escape(str(engine)) + r": rk3588 fp16, ([\d,]+) bytes, REGTASK (\d+) lines \(largest value "
                     r"(\d+)\), built in ([\d.]+) s, converter peak ([\d,]+) MB; simulator vs fp32 on a zeroed and a "
                     r"carried cache: ([\d.]+) dB >= 30 \(gate simulator_vs_fp32_step\); "
                     r"board risk: (clean|at risk: .+); the NPU cost model predicts ([\d.]+) ms per call on rk3588 "
                     r"\(conv [\d.]+, dram [\d.]+, elementwise [\d.]+, dispatch [\d.e-]+, cpu [\d.]+, io [\d.]+ ms; a "
                     r"prediction from the compiler's layer table, not a board number\); contract b4.contract.json",
                     summary)
    assert m, summary
    assert int(m[1].replace(",", "")) == engine.stat().st_size and float(m[4]) > 0
    assert int(m[5].replace(",", "")) > 50 and float(m[6]) >= 30
    assert main(["qwen3", "vocoder", "--onnx", str(step), "--out", str(engine), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)  # the row alone: no summary line, no description
    assert (row["engine"], row["gate"], row["threshold"], row["passed"]) == (
        str(engine), "simulator_vs_fp32_step", 30.0, True)
    assert row["engine_bytes"] == engine.stat().st_size and row["measured"] >= 30 and row["status"] == "ok"
    assert {"dtype", "regtask", "regtask_max_value", "build_s", "converter_peak_mb", "contract", "log",
            "board_risk"} <= set(row)
    assert row["npu_ms_predicted"] == pytest.approx(float(m[8]), abs=0.01) and row["npu_soc"] == "rk3588"
    assert row["npu_ms_predicted"] == pytest.approx(sum(row[f"npu_ms_{k}"] for k in cost.TERMS), abs=0.01)
    # the contract keeps the prediction per core mask, so onnxruntime running the engine's graph can price it
    from rkstudy.contract import for_engine
    from rkstudy.tables import results

    recorded = for_engine(engine).build["npu_predicted"]
    assert recorded["0_1_2"]["ms"] == pytest.approx(row["npu_ms_predicted"], abs=0.01)
    assert set(recorded) == set(cost.MASK_CORES) and recorded["0"]["ms"] >= recorded["0_1_2"]["ms"]
    plan = json.dumps({"speech_decoder": {"impl": "rknn", "artifacts": {"main": str(engine)}}})
    capsys.readouterr()
    assert main(["speak", "qwen3", "--plan", plan, "--model", str(step), "--tokens", "8", "--runtime", "onnx",
                 "--results", str(tmp_path / "results")]) == 0
    said = "".join(capsys.readouterr())
    (spoken,) = results.read_table(tmp_path / "results" / "qwen3_vocoder" / "speak.csv")
    assert f"predicts {spoken['npu_ms_predicted']} ms for speech_decoder on rk3588 (" in said, said
    assert float(spoken["speech_decoder_npu_ms_predicted"]) == pytest.approx(2 * recorded["0_1_2"]["ms"], abs=0.1)
    assert "recorded in its contract" in spoken["npu_cost_note"] and "over 2 calls" in spoken["npu_ms_terms"]
    # onnxruntime ran its graph on this host, for no SoC; the prediction is for the SoC it was compiled for
    assert (spoken["where"], spoken["target"], spoken["npu_soc"]) == ("fp32", "none", "rk3588")
    # offline, the first sample leaves with the last: every call stands before the first audio
    assert spoken["npu_first_audio_ms_predicted"] == spoken["speech_decoder_npu_ms_predicted"]
    assert spoken["npu_first_audio_calls"] == "speech_decoder x2"
    capsys.readouterr()
    # one target and a folder typed with its slash: the engine goes into the folder under its own name
    assert main(["qwen3", "vocoder", "--onnx", str(step), "--out", f"{tmp_path / 'engines'}/", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert Path(row["engine"]).parent == tmp_path / "engines" and Path(row["engine"]).is_file()
    assert Path(row["engine"]).name.startswith("qwen3_vocoder") and not (tmp_path / "engines.contract.json").exists()


def test_json_without_a_stage_2_is_refused(capsys):
    code, err = run(["qwen3", "vocoder", "--skip-rknn", "--json"], capsys)
    assert code == 2 and "--json prints stage 2's row, and --skip-rknn builds no engine" in err


def test_every_gate_has_a_name_of_its_own():
    """A gate's name is what a results row records; two thresholds under one name could not be told apart."""
    import rkstudy
    from rkstudy.gates import Gate

    gates = {}
    for m in pkgutil.walk_packages(rkstudy.__path__, "rkstudy."):
        if m.name.endswith("__main__") or m.name == "rkstudy.toolkit._child":
            continue
        for value in vars(importlib.import_module(m.name)).values():
            if isinstance(value, Gate):
                gates.setdefault(id(value), value)
    names = [g.name for g in gates.values()]
    assert len(names) >= 14 and len(set(names)) == len(names), sorted(names)


def test_stage_one_output_goes_through_one_atomic_save(tmp_path, dynamic_model):
    from rkstudy.contract import Contract, Digest, Tensor
    from rkstudy.produced import Produced

    c = Contract(family="probe", stage="test", inputs=(Tensor("x", (1, 4, 93)),), outputs=(Tensor("y", (1, 4, 93)),),
                 source=Digest(file="dyn.onnx", sha256="0" * 64), producer="a test")
    held = Produced(contract=c, model=dynamic_model)
    first = held.save(tmp_path / "a.onnx")
    assert onnx.load(str(first)).graph.node[0].op_type == "Conv"
    on_disk = Produced(contract=c, path=first)
    assert on_disk.save() == first and on_disk.save(first) == first
    copy = on_disk.save(tmp_path / "b.onnx")
    assert copy.read_bytes() == first.read_bytes()
    assert not list(tmp_path.glob(".*.part"))  # no temporary file left behind
    with pytest.raises(ValueError, match="holds no graph to save"):
        Produced(contract=c).save(tmp_path / "c.onnx")
    assert not (tmp_path / "c.onnx").exists()
