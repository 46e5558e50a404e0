"""Where "every ranked layer in float16" loses (host): one change at a time from the plain quantized
build, so the loss of the toolkit's ranked hybrid is attributed to the kind of tensor that causes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ... import graph
from ...graph.index import Index
from ...toolkit import macs
from .bench import Session


def isolation(session: Session, ranked: Sequence[str]) -> list[dict]:
    """Where the loss of a hybrid that keeps every layer accuracy_analysis names in float16 comes from, one
    change at a time, scored on the full evaluation (per window and per utterance): the plain quantized
    build; the layers that report names in float16 (`ranked`: what such a hybrid keeps, the casts it names
    included); then each kind of config tensor it does not name added in turn (the compiler-made tiles,
    splits and pads, the graph's input casts and reshapes, its output cast), which ends at every quantized
    tensor in float16; and from there each kind alone returned to low bits (the input casts, the output
    cast, the last conv, the flow's Exp where the graph has one). A kind the graph does not have, or the
    report already names, adds no row. Each row names how many tensors its change moved and the first few."""
    stage = session.bench.stage
    names = session.quantized()
    model = graph.load(stage.onnx, load_external_data=False)
    index = Index(model)
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    located = {name: macs.locate(name, index) for name in names}
    ranked_set = set(ranked)

    def kind(name: str) -> str:
        k, found = located[name]
        if k == "tensor" and found in inputs:
            return "input casts"
        if k == "tensor" and found in outputs:
            return "output cast"
        return "ranked" if name in ranked_set else "compiler-made"

    by = {k: [n for n in names if kind(n) == k] for k in ("ranked", "compiler-made", "input casts", "output cast")}

    def node_of(name: str) -> str:
        k, found = located[name]
        node = index.producer.get(found) if k == "tensor" else next((n for n in index.nodes if n.name == found), None)
        return node.name if node is not None else ""

    convs = [n.name for n in model.graph.node if n.op_type in macs.CONV_OPS]
    exps = {n.name for n in model.graph.node if n.op_type == "Exp"}
    rows = []

    def one(keep: Sequence[str], setting: str, change: str, changed: Sequence[str]) -> None:
        rows.append({**session.measure(keep, setting, which="full"), "change": change,
                     "tensors_changed": len(changed), "changed": " ".join(changed[:4]) + (" ..." if len(changed) > 4
                                                                                            else ""),
                     "exp_nodes": len(exps)})

    one([], f"{session.calibration.label}: plain", "nothing in float16", [])
    # what a hybrid of every ranked layer keeps: every name the report gives, the casts it names included
    kept = [n for n in names if n in ranked_set]
    one(kept, "the layers accuracy_analysis names in float16", "the ranked layers", kept)
    for k in ("compiler-made", "input casts", "output cast"):
        added = [n for n in by[k] if n not in kept]
        if added:
            kept = kept + added
            one(kept, f"... + {k} in float16", f"+ {k}", added)
    for k in ("input casts", "output cast"):
        if by[k]:
            one([n for n in names if n not in by[k]], f"every tensor in float16 but the {k}", f"- {k}", by[k])
    if convs:
        last = [n for n in names if node_of(n) == convs[-1]]
        if last:
            one([n for n in names if n not in last], f"every tensor in float16 but the last conv ({convs[-1]})",
                "- last conv", last)
    exp = [n for n in names if node_of(n) in exps]
    if exp:
        one([n for n in names if n not in exp], "every tensor in float16 but the Exp", "- Exp", exp)
    return rows
