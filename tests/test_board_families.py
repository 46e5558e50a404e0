"""Every family's engine, gated on every recorded board tree: `rkstudy board run <family>` through the replay
double of RKNNLite (tests/doubles) on each tree under tests/fixtures/boards, the gate on (the fp32 pass on the
tree, as on a board), each family's engine a real stage-1 graph from its own producer with a placeholder engine
per SoC whose compiled contract records the build stage 2 would (the family's own stage-2 gate). The double
serves the graph each contract names, so a run scores +inf dB at its family's floor.

A tree whose librknnrt is older than the engines' toolkit (2.3.x under 2.5.0 engines) runs them with
--allow-older-runtime, and its row records the warning; the tree without a librknnrt refuses before any child
starts, since there no engine can run."""

import pytest
from board_cli import BOARDS, STAGE2_BUILD, place, port_engine_set, run_cli

from rkstudy import graph
from rkstudy.cli import main
from rkstudy.contract import from_metadata
from rkstudy.tables import results
from rkstudy.targets import ALL_TARGETS

TEXT = "Call me at 555 0142."
JA_TEXT = "良い天気ですね。"
TREES = sorted(p.name for p in BOARDS.iterdir() if (p / "sys").is_dir())
NO_RUNTIME = ("rk3566",)
OLDER_RUNTIME = ("rk3588", "rk3588-npu-powersave", "rk3566-orangepi-3b", "rk3562")


def place_set(folder, onnx_path, gate) -> None:
    """One placeholder engine per SoC beside `onnx_path` (in `folder`), each with the compiled contract stage 2
    writes after passing `gate`."""
    contract = from_metadata(graph.metadata(onnx_path), where=onnx_path.name, remake="x")
    for target in ALL_TARGETS:
        place(folder, contract, onnx_path, target,
              build={**STAGE2_BUILD, "gate": gate.name, "threshold_db": gate.threshold})


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Per family: (engines folder, the `board run` arguments after --engine, the gate it must record)."""
    from rkstudy.families.kokoro_generator.producer import SIM_GATE as KOKORO
    from rkstudy.families.piper_encoder.producer import SIM_GATE as ENCODER
    from rkstudy.families.qwen3_vocoder.producer import SIM_GATE as QWEN3
    from rkstudy.toolkit.convert import ALIVE_GATE

    d = tmp_path_factory.mktemp("families")
    out = {}
    assert main(["piper", "latents", "--text", TEXT, "-o", str(d / "latents.npz")]) == 0
    stage1 = {
        "piper_decoder": (["piper", "decoder", "--skip-rknn"], ALIVE_GATE, ["--latents", d / "latents.npz"]),
        "piper_decoder_stateful": (["piper", "decoder", "--stateful", "--emit", "45", "--skip-rknn"], ALIVE_GATE,
                                   ["--latents", d / "latents.npz"]),
        "piper_encoder": (["piper", "encoder", "--frames", "192", "--skip-rknn"], ENCODER,
                          ["--latents", d / "latents.npz"]),
        "kokoro_generator": (["kokoro", "generator", "--frames", "32", "--context", "4", "--skip-rknn"], KOKORO,
                             ["--inputs", d / "kokoro.npz"]),
        "qwen3_vocoder": (["qwen3", "vocoder", "--widths", "tiny", "--codes-length", "16", "--skip-rknn"], QWEN3,
                          ["--tokens", "32"]),
    }
    assert main(["kokoro", "inputs", "--text", JA_TEXT, "-o", str(d / "kokoro.npz")]) == 0
    for family, (argv, gate, run_args) in stage1.items():
        folder = d / family
        folder.mkdir()
        assert main([*argv, "--output", str(folder / f"{family}.onnx")]) == 0
        place_set(folder, folder / f"{family}.onnx", gate)
        out[family] = (folder, run_args, gate)
    (d / "port").mkdir()
    port_engine_set(d / "port", frames=48, context=8, mel_frames=120)
    out["port"] = (d / "port" / "engines", ["--inputs", d / "port" / "in.npz"], ALIVE_GATE)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["piper_decoder", "piper_decoder_stateful", "piper_encoder", "kokoro_generator",
                                    "qwen3_vocoder", "port"])
def test_every_familys_engine_is_gated_on_every_recorded_tree(sets, family, tmp_path):
    folder, run_args, stage2_gate = sets[family]
    problems = []
    for tree in TREES:
        allow = ["--allow-older-runtime"] if tree in OLDER_RUNTIME else []
        proc = run_cli("board", "run", family, "--engine", folder, *run_args, "--results", tmp_path / tree, *allow,
                       board=tree, check=None)
        if tree in NO_RUNTIME:
            if proc.returncode != 2 or "librknnrt.so is not where RKNNLite loads it" not in proc.stderr:
                problems.append(f"{tree}: exit {proc.returncode}, {proc.stderr[-500:]}")
            continue
        if proc.returncode != 0:
            problems.append(f"{tree}: exit {proc.returncode}, {proc.stderr[-800:]}")
            continue
        (row,) = results.read_table(tmp_path / tree / "board" / f"{family}.csv")
        want = stage2_gate.name.replace("simulator_", "board_", 1)
        if (row["gate"], float(row["gate_threshold_db"]), row["gate_worst_snr_db"]) != (want, stage2_gate.threshold,
                                                                                         "inf"):
            problems.append(f"{tree}: gate {row['gate']} {row['gate_threshold_db']} {row['gate_worst_snr_db']}")
        if bool(row["runtime_warning"]) != bool(allow) or row["where"] != "replay":
            problems.append(f"{tree}: runtime_warning {row['runtime_warning']!r}, where {row['where']}")
        if "passed" not in proc.stdout:
            problems.append(f"{tree}: {proc.stdout[-300:]}")
    assert set(TREES) == {*NO_RUNTIME, *OLDER_RUNTIME, "rk3588-librknnrt-2.5.0", "rk3576"}
    assert not problems, "\n".join(problems)
