"""Stage 1 of the Qwen3 vocoder (host): the seeded decoder re-traced as one fixed-shape streaming step,
exported, made long-axis safe, stamped with its stage contract; and the export hazard census.

The contract (rkstudy.contract, the one every family uses): `codes [1, 16, B]` int64 walked at one
token per frame, `cache_in [1, N]` a state input paired with `cache_out [1, N]`, `audio [1, 1,
B*1920]` walked at 1920 samples per token, no window, no lookahead. `params` carry what stage 2 and
the sidecar read back instead of restating it: the batch size B (`codes_length`, also `emit` for the
stateful walker), the cache size N (`cache_numel` = `state_floats`), head dim, KV length, heads,
layers, the cache layout (name, shape, offset of every state tensor) and its digest (two engines
share a cache only when their layouts' digests agree).

The census counts, after export, the ops the reference documents name as rknn.build hazards (rkstudy.graph.census:
Pad, Exp, Shape, ConstantOfShape, ...) and LayerNorm/Softmax spelt out into primitive patterns, and
predicts an abort in fold_constant from what lint's RK101 rule finds (Shape -> ConstantOfShape /
Range / Expand chains that size a tensor at run time): the producer warns at export time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ... import atomic, gates, graph
from ...cache import digest, entry, locked, made_note, note_made
from ...contract import METADATA_KEY, Contract, Digest, Tensor, from_metadata
from ...errors import EngineMismatch, UsageError
from ...graph.index import Index
from ...process import known_warnings
from ...produced import Produced
from . import EXPORTERS, WIDTHS
from .sidecar import AUDIO, CACHE_IN, CACHE_OUT, CODES, FAMILY, SAMPLE_RATE, SAMPLES_PER_TOKEN

PRODUCER_VERSION = 1  # bump when the producer changes what it writes (keys the cache)
DEFAULT_CODES_LENGTH = 64
PRODUCER = "rkstudy qwen3 vocoder --codes-length 64 --skip-rknn --output qwen3_vocoder_b64.onnx"
SIM_GATE = gates.ENGINE_FLOORS["step"].gate()  # stage 2; a board gates at the same floor


class ExportUnavailable(UsageError):
    """The requested exporter cannot run in this environment (the message names the package)."""


class AbortPredicted(UserWarning):
    """The census predicts that rknn.build will abort on this graph."""


# --- the step ------------------------------------------------------------------------------------
def decoder_for(widths: str = "released", seed: int = 0):
    """The package's decoder at the released config (or the same architecture at toy widths, for
    tests), with seeded random weights."""
    from . import model

    if widths not in WIDTHS:
        raise UsageError(f"--widths {widths!r}: choose one of {', '.join(WIDTHS)}")
    cfg = model.decoder_config(**(model.TINY_OVERRIDES if widths == "tiny" else {}))
    return model.build_decoder(seed=seed, config=cfg)


def producer_command(codes_length: int, widths: str, seed: int, exporter: str) -> str:
    extra = "".join(f" --{k} {v}" for k, v, d in (("widths", widths, "released"), ("seed", seed, 0),
                                                  ("exporter", exporter, "torchscript17")) if v != d)
    return (f"rkstudy qwen3 vocoder --codes-length {codes_length}{extra} --skip-rknn "
            f"--output qwen3_vocoder_b{codes_length}.onnx")


def source_digest(decoder, widths: str, seed: int) -> Digest:
    """The decoder's identity: its widths, seed and the bytes of its (seeded random) weights."""
    h = hashlib.sha256()
    for name, t in sorted(decoder.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return Digest(file=f"qwen-tts-0.1.1 tokenizer_12hz decoder, {widths} config, seed {seed} (random weights)",
                  sha256=h.hexdigest())


def layout_digest(layout) -> str:
    return hashlib.sha256(layout.to_json().encode()).hexdigest()


def step_contract(step, *, source: Digest, producer: str, exporter: str, widths: str, seed: int) -> Contract:
    """The stage contract of a vocoder step (see the module docstring)."""
    B, lay = step.B, step.layout
    n, q = lay.numel, int(step.codebooks.shape[0])
    return Contract(
        family=FAMILY, stage="vocoder",
        inputs=(Tensor(CODES, (1, q, B), dtype="int64", role="walked", axis=2),
                Tensor(CACHE_IN, (1, n), role="state")),
        outputs=(Tensor(AUDIO, (1, 1, B * SAMPLES_PER_TOKEN), role="walked", axis=2, rate=SAMPLES_PER_TOKEN),
                 Tensor(CACHE_OUT, (1, n), role="state")),
        source=source, producer=producer, state=((CACHE_IN, CACHE_OUT),),
        params={"codes_length": B, "emit": B, "lookahead_samples": 0, "cache_numel": n, "state_floats": n,
                "head_dim": lay.head_dim, "kv_len": lay.kv_len, "num_heads": lay.num_heads,
                "num_layers": lay.num_layers, "num_quantizers": q,
                "codebook_size": int(step.codebooks.shape[1]), "samples_per_token": SAMPLES_PER_TOKEN,
                "sample_rate": SAMPLE_RATE, "exporter": exporter, "widths": widths, "seed": seed,
                "cache_groups": lay.by_group(), "cache_layout_sha256": layout_digest(lay),
                "cache_layout": json.loads(lay.to_json()),
                "weights": "seeded random: the checkpoint is not obtainable here; the output is not speech"})


def contract_row(c: Contract) -> dict:
    """The numbers stage 2 reads back out of the graph (the reference documents' "batch size, cache size, head
    dim, KV length")."""
    return {k: c.params[k] for k in ("codes_length", "cache_numel", "head_dim", "kv_len", "num_heads", "num_layers")}


def _io_shapes(model) -> dict[str, list[int]]:
    init = {i.name for i in model.graph.initializer}
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output) if v.name not in init}


def read_contract(model) -> Contract:
    """The step contract of an exported graph, checked against its I/O shapes (a graph exported with
    a dynamic token axis, or edited after export, is refused with the command that makes a good one)."""
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else graph.load(model, load_external_data=False)
    name = Path(model).name if isinstance(model, (str, Path)) else "this ONNX"
    c = from_metadata(graph.metadata(proto), where=name, remake=PRODUCER)
    c.check_family(FAMILY, PRODUCER)
    io = _io_shapes(proto)
    bad = [f"{t.name}: graph {io.get(t.name)} vs contract {list(t.shape)}" for t in c.inputs + c.outputs
           if io.get(t.name) != list(t.shape)]
    layout = c.params.get("cache_layout", {}).get("segments", [])
    total = sum(int(np.prod(s[1])) for s in layout)
    if total != c.params.get("cache_numel"):
        bad.append(f"the cache layout sums to {total} floats, the contract says {c.params.get('cache_numel')}")
    if bad:
        raise EngineMismatch(f"{name} disagrees with its contract ({'; '.join(bad)}); export it again with "
                             f"`{c.producer}`")
    return c


# --- export ----------------------------------------------------------------------------------------
def example_inputs(step, seed: int = 0):
    """Codes and a non-zero cache for tracing (with a zero cache, nothing would depend on state)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k = step.codebooks.shape[:2]
    return torch.randint(0, k, (1, q, step.B), generator=g), torch.randn(1, step.layout.numel, generator=g) * 0.1


def export_raw(step, path: Path, exporter: str) -> None:
    """Trace `step` to `path` with one exporter setting (EXPORTERS)."""
    import torch

    args = example_inputs(step)
    names = dict(input_names=[CODES, CACHE_IN], output_names=[AUDIO, CACHE_OUT])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter in ("torchscript17", "torchscript17_pkgsnake"):
            torch.onnx.export(step, args, str(path), dynamo=False, opset_version=17, **names)
        elif exporter == "torchscript17_dynamic":
            torch.onnx.export(step, args, str(path), dynamo=False, opset_version=17, **names,
                              dynamic_axes={CODES: {2: "tokens"}, AUDIO: {2: "samples"}})
        elif exporter == "torchscript14":
            torch.onnx.export(step, args, str(path), dynamo=False, opset_version=14, **names)
        elif exporter == "dynamo":
            try:
                import onnxscript  # noqa: F401
            except ImportError:
                raise ExportUnavailable("the dynamo exporter needs onnxscript, which is not installed here: "
                                        "pip install onnxscript, or use --exporter torchscript17") from None
            # verbose=False: the exporter's per-stage lines ("Obtain model graph ... ✅") are progress, not results
            with known_warnings("torchvision"):
                program = torch.onnx.export(step, args, dynamo=True, external_data=False, verbose=False, **names)
            program.save(str(path), external_data=False)
        else:
            raise UsageError(f"--exporter {exporter!r}: choose one of {', '.join(EXPORTERS)}")


@dataclass(kw_only=True)
class VocoderStep(Produced):
    """One produced step, on disk (contract in its metadata), with its census (a dict), what the
    long-axis pass rewrote, and the export seconds of the run that made it (a cache entry keeps them
    beside it: rkstudy.cache.note_made)."""

    rewrite: dict
    seconds: float

    def row(self) -> dict:
        p = self.contract.params
        return {"exporter": p["exporter"], "codes_length": p["codes_length"], **self.census, **self.rewrite,
                "onnx_mb": round(self.path.stat().st_size / 1e6, 1),
                "export_s": round(self.seconds, 1)}


def produce(codes_length: int = DEFAULT_CODES_LENGTH, *, widths: str = "released", seed: int = 0,
            exporter: str = "torchscript17", output: Path | str | None = None, decoder=None,
            long_axis: bool = True) -> VocoderStep:
    """Re-trace the seeded decoder as a `codes_length`-token step, export it with `exporter`, make its
    long axes compile cleanly (rkstudy.graph.longaxis), census it (warning when it predicts an abort), stamp the
    contract and save to `output` (default: the cache, keyed by everything that made it)."""
    import onnx
    import torch

    if codes_length < 1:
        raise UsageError(f"--codes-length {codes_length}: a step voices at least 1 token")
    if exporter not in EXPORTERS:
        raise UsageError(f"--exporter {exporter!r}: choose one of {', '.join(EXPORTERS)}")
    command = producer_command(codes_length, widths, seed, exporter)
    make = functools.partial(_make, codes_length, widths=widths, seed=seed, exporter=exporter, decoder=decoder,
                             long_axis=long_axis, command=command)
    if output is not None:
        return make(Path(output))
    output = entry(FAMILY, f"step_{widths}_b{codes_length}_{exporter}{'' if long_axis else '_raw'}",
                   digest(codes_length, widths, seed, exporter, long_axis, PRODUCER_VERSION, torch.__version__,
                          onnx.__version__), ".onnx")
    with locked(output):  # two studies asking for one step: the second reads what the first made
        made = made_note(output, "export_s")
        if output.exists() and made is not None:  # the contract as stored (read_contract refuses a dynamic export's)
            c = from_metadata(graph.metadata(output), where=output.name, remake=command)
            return VocoderStep(path=output, contract=c, census=hazard_census(output),
                               rewrite=c.params.get("long_axis_rewrite", {}), seconds=made["export_s"])
        produced = make(output)
        note_made(output, export_s=produced.seconds)
        return produced


def _make(codes_length: int, output: Path, *, widths: str, seed: int, exporter: str, decoder, long_axis: bool,
          command: str) -> VocoderStep:
    import onnx
    import torch

    from ...graph.longaxis import long_axis_safe
    from .step import StreamingStep

    torch.set_num_threads(1)
    t0 = time.monotonic()
    decoder = decoder if decoder is not None else decoder_for(widths, seed)
    step = StreamingStep(decoder, codes_length, fold_snake=exporter != "torchscript17_pkgsnake").eval()
    with tempfile.TemporaryDirectory(prefix="rkstudy-qwen3-") as tmp:
        export_raw(step, Path(tmp) / "raw.onnx", exporter)
        model = onnx.load(str(Path(tmp) / "raw.onnx"))
    rewrite = {}
    if long_axis:
        model, done = long_axis_safe(model)
        rewrite = done.row()
    contract = step_contract(step, source=source_digest(decoder, widths, seed), producer=command,
                             exporter=exporter, widths=widths, seed=seed)
    contract = replace(contract, params={**contract.params, "long_axis_rewrite": rewrite})
    model = graph.with_metadata(model, **{METADATA_KEY: contract.to_json()})
    census = hazard_census(model)
    warn_if_abort(census, Path(output).name)
    atomic.save_onnx(model, output)
    return VocoderStep(path=output, contract=contract, census=census, rewrite=rewrite, seconds=time.monotonic() - t0)


# --- hazard census -----------------------------------------------------------------------------------
def decomposed_layernorm(model, consumers=None) -> int:
    """ReduceMean(x) -> Sub(x, mean) -> (Pow|Mul) -> ReduceMean: a LayerNorm spelt out (RMSNorm has
    no Sub and is not counted)."""
    consumers = consumers or Index(model).consumers
    count = 0
    for n in model.graph.node:
        if n.op_type != "ReduceMean":
            continue
        for sub in consumers.get(n.output[0], []):
            sq = [c for c in consumers.get(sub.output[0], []) if sub.op_type == "Sub" and c.op_type in ("Pow", "Mul")]
            if any(c2.op_type == "ReduceMean" for c in sq for c2 in consumers.get(c.output[0], [])):
                count += 1
                break
    return count


def decomposed_softmax(model, consumers=None) -> int:
    """Exp(x) feeding a ReduceSum and a Div: a Softmax spelt out."""
    consumers = consumers or Index(model).consumers
    count = 0
    for n in model.graph.node:
        users = consumers.get(n.output[0], []) if n.op_type == "Exp" else []
        if any(u.op_type == "ReduceSum" for u in users) and any(u.op_type == "Div" for u in users):
            count += 1
    return count


def hazard_census(model) -> dict:
    """Nodes, rkstudy.graph.census's hazard ops, LayerNorm/Softmax (fused and spelt out), Exp on a
    constant (an un-folded Snake exp(alpha)), and lint RK101's run-time shape chains."""
    from ...lint import lint

    proto = graph.load(model)
    c = graph.census(proto, with_axis=False)
    idx = Index(proto)
    cons = idx.consumers
    ops = Counter(n.op_type for n in proto.graph.node)
    row = {"nodes": c.nodes, "compute_nodes": c.nodes - ops.get("Constant", 0),
           "opset": max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0),
           **{op: c.hazards[op] for op in ("Pad", "Exp", "Shape", "ConstantOfShape", "Range")},
           "LayerNormalization": ops.get("LayerNormalization", 0), "Softmax": ops.get("Softmax", 0),
           "layernorm_decomposed": decomposed_layernorm(proto, cons),
           "softmax_decomposed": decomposed_softmax(proto, cons),
           "exp_on_constants": sum(1 for n in proto.graph.node if n.op_type == "Exp" and idx.is_const(n.input[0]))}
    try:
        findings = lint(proto, select=["RK101"]).findings
    except Exception as exc:  # a graph lint cannot view (unpinnable shapes) is reported, not hidden
        row["shape_chains"], row["lint_error"] = -1, f"{type(exc).__name__}: {exc}"
        return row
    row["shape_chains"] = len(findings)
    return row


# the newest opset rknn-toolkit2 2.5.0's load_onnx accepts (measured on the dynamo export, opset 20:
# "Unsupport onnx opset 20, need <= 19"; the same graph exported at opset 18 builds)
MAX_OPSET = 19


def predict_abort(census: dict) -> tuple[bool, str]:
    """(failure expected, why) for rknn.build on a graph with this census: an opset past MAX_OPSET
    (load_onnx refuses it), or run-time shape chains (lint RK101), which the reference documents saw abort
    fold_constant with a core dump (rknn-toolkit2 2.3.2; their 2653-node export). The measured builds
    beside the prediction say what 2.5.0 does."""
    if census.get("opset", 0) > MAX_OPSET:
        return True, f"opset {census['opset']}: load_onnx of rknn-toolkit2 2.5.0 takes opset <= {MAX_OPSET}"
    if census.get("shape_chains", 0) > 0:
        return True, (f"{census['shape_chains']} run-time Shape -> ConstantOfShape/Range/Expand chain(s): the "
                      "reference documents' "
                      "rknn.build would abort in fold_constant with a core dump")
    if census.get("shape_chains", 0) < 0:
        return True, "lint could not pin the graph's shapes (a dynamic axis)"
    return False, "no run-time shape chains"


def warn_if_abort(census: dict, where: str) -> bool:
    """Say so at export time, where it is cheap to act on; True when an abort is predicted."""
    abort, why = predict_abort(census)
    if abort:
        warnings.warn(f"{where}: the toolkit is expected to refuse this graph ({why}); export with --exporter "
                      "torchscript17 (opset 17, fixed shapes) or fold at pinned shapes first (rkstudy fold)",
                      AbortPredicted, stacklevel=2)
    return abort


# --- stage 2's probe -----------------------------------------------------------------------------------
def carried_feeds(onnx_path, steps: int, seed: int, contract: Contract | None = None) -> list[dict]:
    """The (codes, cache_in) feeds of `steps` consecutive steps of a random-code stream (codes from
    `seed`) from a zeroed cache, the cache carried by onnxruntime fp32: a real cache, whose KV history
    and validity flags describe a past."""
    from ...runtime import OrtRunner
    from ...walk.stateful import carried_feeds as walk_feeds
    from .sidecar import random_codes

    contract = contract or read_contract(onnx_path)
    p = contract.params
    codes = random_codes(steps * p["codes_length"], seed, num_quantizers=p["num_quantizers"],
                         codebook_size=p["codebook_size"])
    return walk_feeds(OrtRunner(onnx_path), contract, {CODES: codes[0]})


def state_probe(onnx_path, contract: Contract, steps: int = 3, seed: int = 0) -> list[dict]:
    """Stage 2's probe: the inputs of the first step (zeroed cache) and of step `steps` (the cache the
    fp32 graph carried there) of a random-code stream, so the simulator gate covers the cache path."""
    feeds = carried_feeds(onnx_path, steps, seed, contract)
    return [feeds[0], feeds[-1]]

