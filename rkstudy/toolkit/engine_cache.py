"""The keys and names of engines (host): the content key that finds a build in the cache, whoever asks for
it (build_engine, a simulator child, lint, the lever studies), the path the cache keeps it at, and the
short key a stage-2 engine's file name carries for a person to read.

Kept apart from the build so that a caller can find an engine, or name one, without starting anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import cache, graph
from ..cache import sha256_file
from .calibration import Calibration
from .envs import toolkit_env


def default_engine_path(onnx_path: Path, target: str, key: str) -> Path:
    """The one naming scheme for engines in the cache: derived from the stage contract in the ONNX
    metadata when there is one (family, compiled width, target), from the file name otherwise,
    and keyed by everything that made the engine; an engine already built under that key is found
    whatever its name."""
    from .. import contract as contracts

    props = graph.metadata(onnx_path)
    if contracts.METADATA_KEY in props:
        name = contracts.from_metadata(props, where=onnx_path.name, remake="its producer").engine_name(target, key)
    else:
        name = f"{onnx_path.stem}-{target}-{key}.rknn"
    path = cache.cache_dir("engines") / name
    if not path.exists():
        # the key is over the graph's bytes: the same graph saved under another name (a lint probe of the
        # toolchain's conv) is the same engine
        path = next(iter(sorted(path.parent.glob(f"*-{target}-{key}.rknn"))), path)
    return path


def engine_key(onnx_path, target: str, shapes: Mapping[str, Sequence[int]] | None = None, *,
               optimization_level: int = 3, quantize: Calibration | None = None,
               toolkit: str | None = None, shape_sets: Sequence[Mapping[str, Sequence[int]]] = ()
               ) -> tuple[str, dict[str, list[int]]]:
    """The content key of an engine (ONNX bytes, target, shapes, level, toolkit, calibration, and the
    shape sets of a multi-shape engine) and the shapes it was built at: one key, whoever builds it
    (build_engine, a simulator child, lint)."""
    onnx_path = Path(onnx_path)
    shapes = {k: [int(d) for d in v] for k, v in
              (shapes if shapes is not None else graph.input_shapes(onnx_path)).items()}
    env = toolkit_env(toolkit)
    key = cache.digest(onnx_path, target, shapes, optimization_level, env.version,
                       # an fp16 key has no calibration term, nor a single-shape key a sets term
                       *([quantize.key(list(shapes))] if quantize else []),
                       *([("shape_sets", list(shape_sets))] if shape_sets else []))
    return key, shapes


def name_key(onnx_path, toolkit: str | None = None, quantize: Calibration | None = None,
             input_names: Sequence[str] = ()) -> str:
    """The key in a stage-2 engine's file name (Contract.engine_name: `<family>-w<width>-<target>-<key>.rknn`):
    12 hex of the compiled graph's sha256, `-tk<version>` when a toolkit version is asked for, so one folder
    holds a graph's engines of two toolkits, and for a quantized engine `-q` and 8 hex of its calibration's
    key (settings and arrays, in `input_names` order), so it never takes an fp16 engine's name.

    It names, it does not find: the target stands beside it in the name, and a build is found in the cache
    by engine_key, which covers everything that made the engine (shapes, optimization level, toolkit)."""
    key = sha256_file(onnx_path)[:12]
    key = f"{key}-tk{toolkit}" if toolkit else key
    if quantize is not None:
        key = f"{key}-q{cache.digest(quantize.key(list(input_names)))[:8]}"
    return key
