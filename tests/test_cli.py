import json

import onnx
import pytest

from rkstudy import graph
from rkstudy.cli import main, parse_shapes


def test_parse_shapes():
    assert parse_shapes(["z:1,192,93", "y_mask:1,1,93"]) == {"z": [1, 192, 93], "y_mask": [1, 1, 93]}
    assert parse_shapes(["/enc/Add_output_0:1,2"]) == {"/enc/Add_output_0": [1, 2]}
    with pytest.raises(SystemExit, match="NAME:D0,D1"):
        parse_shapes(["z=1,192"])


def test_fold_then_build_from_the_command_line(dynamic_model, tmp_path, capsys):
    src, folded, engine = tmp_path / "dyn.onnx", tmp_path / "folded.onnx", tmp_path / "e.rknn"
    onnx.save(dynamic_model, str(src))
    assert main(["fold", str(src), "--shape", "x:1,4,93", "-o", str(folded)]) == 0
    assert "Shape 1 -> 0, ConstantOfShape 1 -> 0" in capsys.readouterr().out
    assert graph.input_shapes(folded) == {"x": (1, 4, 93)}
    assert main(["build", str(folded), "--target", "rk3566", "--out", str(engine)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "ok" and report["target"] == "rk3566" and engine.exists()
    assert main(["census", str(folded)]) == 0
    census = json.loads(capsys.readouterr().out)
    assert census["Shape"] == 0 and census["longest_axis"] == 93


def test_errors_are_one_line_with_the_fix(tmp_path, capsys):
    assert main(["piper", "decoder", "--voice-onnx", str(tmp_path / "none.onnx"), "--skip-rknn"]) == 1
    assert "rkstudy: error: no voice ONNX at" in capsys.readouterr().err
    bare = tmp_path / "bare.onnx"
    from rkstudy.families.toolchain import vocoder_probe

    onnx.save(vocoder_probe(), str(bare))
    from rkstudy.families.piper import default_voice_paths

    config = default_voice_paths()[1]
    assert main(["piper", "decoder", "--voice-onnx", str(bare), "--voice-config", str(config), "--skip-rknn"]) == 1
    assert "no /flow/ and /dec/ nodes in this graph; is this a Piper (VITS) voice" in capsys.readouterr().err
    assert main(["piper", "decoder", "--onnx", str(bare)]) == 1
    assert "carries no window contract; produce it with `rkstudy piper decoder --voice-onnx" in capsys.readouterr().err
