"""What stage 1 of every family hands on: one graph with its stage contract in the metadata.

A family's stage 1 returns a Produced (or a subclass that adds what the family measured on the way:
census, rewrite findings, the stateful surgery's record). Stage 2 needs only the graph on disk, and
`save` is the one way it gets there: through rkstudy.atomic, so a killed writer never leaves a
truncated graph under the name stage 2 reads.

Host side (the graph is an onnx.ModelProto or a file written by a producer).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from . import atomic
from .contract import Contract


@dataclass(kw_only=True)
class Produced:
    """The graph as `model` (in memory) or at `path` (already on disk, usually in the cache), its
    contract and, where the family counts it, its census. A study may describe a graph it never made
    (neither given); such a Produced has nothing to save."""

    contract: Contract
    model: object | None = None  # onnx.ModelProto
    path: Path | None = None
    census: object | None = None  # what the family counted in the graph (graph.Census, or a dict)

    def __post_init__(self):
        if self.path is not None:
            self.path = Path(self.path)

    def cache_name(self) -> str:
        """The name a graph held only in memory gets in the cache (keyed by its bytes there)."""
        return f"{self.contract.family}_w{self.contract.window.frames}" if self.contract.window \
            else self.contract.family

    def load(self):
        """The graph as an onnx.ModelProto (read from `path` when it is not in memory)."""
        if self.model is None:
            import onnx

            return onnx.load(str(self.path))
        return self.model

    def save(self, output: Path | str | None = None) -> Path:
        """Write the graph to `output` (always rewritten) and return its path; without `output`, the
        graph's own file (a graph held in memory goes to the cache, keyed by its bytes). Either way
        through a temporary file and a rename."""
        if self.model is None and self.path is None:
            raise ValueError(f"{self.contract.family}: this Produced holds no graph to save (give model or path)")
        if output is None:
            if self.path is not None:
                return self.path
            from .cache import cached_bytes

            return cached_bytes("slices", self.cache_name(), self.model.SerializeToString(), ".onnx")
        output = Path(output)
        if self.path is not None and self.path.resolve() == output.resolve():
            return output
        if self.model is not None or self.path.with_name(f"{self.path.name}.data").exists():
            return atomic.save_onnx(self.load(), output)  # external weights are renamed with the graph
        with atomic.replacing(output) as tmp:
            shutil.copyfile(self.path, tmp)
        return output
