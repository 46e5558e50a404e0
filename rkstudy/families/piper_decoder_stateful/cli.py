"""The handlers behind `rkstudy piper decoder --stateful --emit E` (stage 1) and behind stage 2 of a
stateful step (`rkstudy piper decoder --onnx decoder_step.onnx`, which reads the contract and comes
here). The flags live in piper_decoder's command: the stateful step is another product of the same
stage. Importing this module is board safe; the handlers import the host code they need.
"""

from __future__ import annotations

from pathlib import Path


def convert_step(onnx_path: Path, target: str | list[str], out: Path | None, remake: str, as_json: bool = False,
                 toolkit: str | None = None) -> int:
    """Stage 2 for a stateful step: compile, gate the simulator against fp32 on a white-noise step with
    zero state and on one with the state the fp32 graph carried (rkstudy.toolkit.convert.ALIVE_GATE), write the
    compiled contract beside the engine."""
    from ...cliutil import stage2
    from .producer import state_probe

    def describe(contract) -> str:
        p = contract.params
        return (f"{onnx_path.name}: {contract.family}, stateful step of {p['emit']} frames, lookahead "
                f"{p['lookahead_samples']} samples ({p['lookahead_frames']:.2f} frames), state {p['state_floats']} "
                f"floats in {len(p['state_layout'])} tensors, hop {p['hop']}, {p['channels']} channels")

    return stage2(onnx_path, target, out, describe=describe, remake=remake,
                  probe=lambda c: state_probe(onnx_path, c), probed_on="a white-noise step, zero and carried state",
                  as_json=as_json, toolkit=toolkit)


def produce(args, producer: str) -> int:
    """Stage 1: the step, a self-check of its fp32 walk against a full-length decode, the ONNX; then
    stage 2 unless --skip-rknn."""
    from ..piper.voice import Voice
    from .producer import DEFAULT_EMIT, produce_step_for_voice
    from .study import self_check

    voice = Voice(args.voice_onnx, args.voice_config)
    produced = produce_step_for_voice(voice, args.emit or DEFAULT_EMIT, producer=producer)
    p = produced.contract.params
    print(f"stateful step of {p['emit']} frames from the --dec-mask slice: {len(produced.model.graph.node)} nodes, "
          f"lookahead {p['lookahead_samples']} samples ({p['lookahead_frames']:.2f} frames), state "
          f"{p['state_floats']} floats in {len(p['state_layout'])} tensors")
    row = self_check(voice, produced)
    print(f"self-check: {row['measured']:.1f} dB against a full-length decode, every sample (gate "
          f"{row['threshold']} dB, fp32)")
    output = produced.save(args.output or Path(f"decoder_step_e{p['emit']}.onnx"))
    print(f"wrote {output}")
    return 0 if args.skip_rknn else convert_step(output, args.target, args.out, produced.contract.producer, args.json,
                                                    args.toolkit)
