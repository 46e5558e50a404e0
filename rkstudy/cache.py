"""Build outputs (ONNX slices, engines, logs) live outside git, keyed by what made them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cache_dir(*parts: str) -> Path:
    """`$RKSTUDY_CACHE/<parts>` (default `build/cache` in the checkout), created on demand."""
    root = Path(os.environ.get("RKSTUDY_CACHE", REPO / "build" / "cache"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def digest(*parts) -> str:
    """A short stable key over files (by content), bytes and JSON-able values."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            with open(part, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        elif isinstance(part, bytes):
            h.update(part)
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
