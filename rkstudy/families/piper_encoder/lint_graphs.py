"""The Piper encoder's graphs as the lint study lints them (host), per width: the raw slice linted at
the width, the folded slice (relative-shift chains left) and the rewritten one (what the engine is
compiled from), each with real padded tokens as the sample."""

from __future__ import annotations

from ...lint.study import FamilyGraph


def lint_graphs(quick: bool) -> list[FamilyGraph]:
    from ..piper.voice import Voice
    from . import producer
    from .seam import shapes_for
    from .study import FULL_WIDTHS, QUICK_WIDTHS
    from .tokens import pad_ids, real_tokens

    voice = Voice()
    out = []
    for w in QUICK_WIDTHS[:1] if quick else FULL_WIDTHS:
        product = producer.produce(voice, w)
        sample = pad_ids(real_tokens(voice, w - 1), w)
        pins = {k: tuple(v) for k, v in shapes_for(w).items()}
        out += [FamilyGraph("piper_encoder", "raw", f"slice at width {w}, dynamic (linted pinned)", product.raw,
                            pins, sample),
                FamilyGraph("piper_encoder", "raw", f"folded at width {w} (chains left)", product.folded,
                            sample=sample),
                FamilyGraph("piper_encoder", "rewritten", f"rewritten at width {w}", product.rewritten, sample=sample)]
    return out
