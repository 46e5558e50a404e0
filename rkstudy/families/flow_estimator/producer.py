"""Stage 1 of the flow estimator (host): the DiT stand-in with seeded random weights, exported at a
fixed S, folded, and stamped with its stage contract.

The estimator is called once per flow-matching step on the whole utterance, so an engine is
compiled at a fixed frame count S and an utterance of n <= S frames is right-padded to S: x, mu and
cond are `padded` inputs at [1, 80, S], mask is 1 over the n real frames, t (the step's time) and
spks (the speaker embedding) are constants, and the output is padded like the inputs. The ladder of
S engines (rkstudy.board.memory.LazyLadder) picks the smallest S >= n.

The real CosyVoice3 estimator is not obtainable here, so the source is the stand-in itself: its
digest is over its weights' bytes (seeded random), and every size measured from it is the
stand-in's own.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ... import atomic, gates, graph
from ...cache import digest, entry, locked, made_note, note_made
from ...contract import METADATA_KEY, Contract, Digest, Tensor, from_metadata
from ...produced import Produced
from . import standin

FAMILY = "flow_estimator"
PRODUCER_VERSION = 1  # bump when the producer changes what it writes (keys the cache)
PRODUCER = "rkstudy cosyvoice3 estimator --frames S --skip-rknn --output estimator_sS.onnx"
SIM_GATE = gates.ENGINE_FLOORS["estimator"].gate()  # stage 2; a board gates at the same floor


def producer_command(frames: int, cfg: standin.DiTConfig, seed: int) -> str:
    extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in (("attn_form", cfg.attn_form),
                                                                   ("attn_bias", cfg.attn_bias))
                    if v != getattr(standin.COSYVOICE3, k))
    return (f"rkstudy cosyvoice3 estimator --frames {frames} --depth {cfg.depth} --seed {seed}{extra} "
            f"--skip-rknn --output estimator_s{frames}.onnx")


def source_digest(model, cfg: standin.DiTConfig, seed: int) -> Digest:
    """The stand-in's identity: its configuration, seed and the bytes of its (random) weights."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().numpy().tobytes())
    name = f"dit-standin-d{cfg.depth}-{cfg.attn_form}-{cfg.attn_bias}-seed{seed} (random weights)"
    return Digest(file=name, sha256=h.hexdigest())


def estimator_contract(*, frames: int, cfg: standin.DiTConfig, seed: int, source: Digest,
                       producer: str) -> Contract:
    """Noisy mel x, mu and cond right-padded to S, their frame mask, t and spks constant; the
    estimator's output padded like its inputs."""
    return Contract(
        family=FAMILY, stage="estimator",
        inputs=(Tensor("x", (1, cfg.mel_dim, frames), role="padded", axis=2),
                Tensor("mask", (1, 1, frames), role="mask", axis=2),
                Tensor("mu", (1, cfg.mu_dim, frames), role="padded", axis=2),
                Tensor("t", (1,), role="constant"),
                Tensor("spks", (1, cfg.spk_dim), role="constant"),
                Tensor("cond", (1, cfg.mel_dim, frames), role="padded", axis=2)),
        outputs=(Tensor(standin.OUTPUT, (1, cfg.mel_dim, frames), role="padded", axis=2),),
        source=source, producer=producer,
        params={"frames": frames, **{k: v for k, v in asdict(cfg).items()}, "seed": seed,
                "parameters": standin.parameter_count(cfg),
                "weights": "seeded random: a stand-in, its outputs are not speech"})


@dataclass(kw_only=True)
class EstimatorGraph(Produced):
    """One produced S: the folded graph on disk (contract in its metadata), the node counts before
    and after the fold, and the export and fold seconds of the run that made it: a cache entry keeps
    both beside it, so a graph another study put in the cache reads the same row as one made here."""

    frames: int
    raw_nodes: int
    folded_nodes: int
    seconds: float

    def row(self) -> dict:
        p = self.contract.params
        return {"S": self.frames, "depth": p["depth"], "attn": f"{p['attn_form']}/{p['attn_bias']}",
                "parameters": p["parameters"], "raw_nodes": self.raw_nodes, "folded_nodes": self.folded_nodes,
                "onnx_bytes": self.path.stat().st_size,
                "export_fold_s": round(self.seconds, 1)}


def produce(frames: int, *, depth: int = 2, seed: int = 0, attn_form: str = "sdpa", attn_bias: str = "key",
            output: Path | str | None = None) -> EstimatorGraph:
    """Build the stand-in, export at `frames`, fold at the pinned shapes, write the contract into the
    graph, save it to `output` (default: the cache, keyed by everything that made it)."""
    import onnxslim
    import torch

    if frames < 2:
        from ...errors import UsageError

        raise UsageError(f"--frames {frames}: the estimator needs at least 2 frames")
    cfg = standin.standin_config(depth, attn_bias, attn_form)
    if output is not None:
        return _make(frames, cfg, seed, Path(output))
    output = entry(FAMILY, f"estimator_s{frames}_d{depth}_{attn_form}_{attn_bias}",
                   digest(asdict(cfg), frames, seed, PRODUCER_VERSION, torch.__version__, onnxslim.__version__),
                   ".onnx")
    with locked(output):  # two studies asking for one graph: the second reads what the first made
        made = made_note(output, "raw_nodes", "export_fold_s")
        if output.exists() and made is not None:
            nodes = graph.census(output, with_axis=False).nodes
            return EstimatorGraph(frames=frames, path=output, contract=read_contract(output),
                                  raw_nodes=made["raw_nodes"], folded_nodes=nodes, seconds=made["export_fold_s"])
        produced = _make(frames, cfg, seed, output)
        note_made(output, raw_nodes=produced.raw_nodes, export_fold_s=produced.seconds)
        return produced


def _make(frames: int, cfg, seed: int, output: Path) -> EstimatorGraph:
    t0 = time.monotonic()
    model = standin.build(cfg, seed=seed)
    with tempfile.TemporaryDirectory(prefix="rkstudy-dit-") as tmp:
        raw = standin.export(model, frames, Path(tmp) / "raw.onnx")
        raw_nodes = graph.census(raw, with_axis=False).nodes
        folded = graph.fold(raw, standin.input_shapes(frames, cfg))
    contract = estimator_contract(frames=frames, cfg=cfg, seed=seed, source=source_digest(model, cfg, seed),
                                  producer=producer_command(frames, cfg, seed))
    atomic.save_onnx(graph.with_metadata(folded, **{METADATA_KEY: contract.to_json()}), output)
    return EstimatorGraph(frames=frames, path=output, contract=contract, raw_nodes=raw_nodes,
                          folded_nodes=len(folded.graph.node), seconds=time.monotonic() - t0)


def read_contract(model) -> Contract:
    name = Path(model).name if isinstance(model, (str, Path)) else "this ONNX"
    return from_metadata(graph.metadata(model), where=name, remake=PRODUCER)


def feeds(contract: Contract, seed: int = 1, valid: float = 0.9) -> dict[str, np.ndarray]:
    """Inputs at the scales the estimator sees, shaped by the contract: unit-normal noisy mel, mu
    and cond (cond zero on padding), t in [0, 1], a mask over the first `valid` share of frames."""
    from dataclasses import replace

    x, spks = contract.tensor("x"), contract.tensor("spks")
    cfg = replace(standin.COSYVOICE3, mel_dim=x.shape[1], mu_dim=contract.tensor("mu").shape[1],
                  spk_dim=spks.shape[1])
    frames = x.shape[2]
    return standin.random_inputs(frames, cfg, seed=seed, valid=max(1, int(frames * valid)))


def probe(contract: Contract) -> list[dict[str, np.ndarray]]:
    """Stage 2's probe: one feed of estimator-like inputs (`feeds`), 90% of the frames real."""
    return [feeds(contract)]
