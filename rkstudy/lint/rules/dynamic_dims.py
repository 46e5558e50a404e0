"""RK401 dynamic-input: input dimensions left unpinned. RKNN engines have fixed shapes."""

from __future__ import annotations

from .. import Hit, rule


def _dims(dims) -> str:
    return "x".join(str(d) for d in dims)


@rule("RK401", "dynamic-input")
def dynamic_input(g):
    """Graph inputs whose dims are not all concrete (and those pinned only for this lint run)."""
    for name, dims in g.dynamic.items():
        yield Hit("error", [name], f"input {name} has dims {_dims(dims)}: not pinned",
                  why="measured (rknn-toolkit2 2.5.0, results/lint/honesty.md): load_onnx refuses it "
                      "(\"The input shape ... is not support\"); RKNN engines have fixed shapes",
                  fix=f"pin it: `rkstudy lint MODEL.onnx --input {name}=D0xD1x...` to lint at a shape, then "
                      f"`rkstudy fold MODEL.onnx --shape {name}:D0,D1,... -o pinned.onnx` (or `rkstudy build --shape`)",
                  detail={"dims": _dims(dims)})
    for name, shape in g.pinned.items():
        declared = g.declared.get(name)
        if declared is None or any(d is None for d in declared):
            yield Hit("info", [name], f"input {name} is dynamic in the file; linted at {_dims(shape)}",
                      why="the findings hold at this shape only, and the engine must be built at it",
                      fix=f"`rkstudy fold MODEL.onnx --shape {name}:{','.join(map(str, shape))} -o pinned.onnx` "
                          f"(or `rkstudy build --shape {name}:{','.join(map(str, shape))}`)",
                      detail={"dims": _dims(shape)})
