"""The one write policy: everything the package writes goes through a temporary file in the same
folder and a rename, so a reader (or a cache lookup) never sees a half-written file, and a writer
killed halfway leaves the old file (or none) under the final name, never a truncated one.

Board side: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replacing(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on a clean exit it replaces `path` (an explicit output
    is always rewritten), on an exception it is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the result is an ordinary file
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: Path | str, data: bytes) -> Path:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path | str, text: str) -> Path:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def save_onnx(model, path: Path | str) -> Path:
    """Write an ONNX ModelProto atomically (small models as one blob; past protobuf's 2 GB limit
    the weights go to an external-data file beside it, written first under a temporary name)."""
    size = model.ByteSize()
    if size < 2**31 - 1:
        return write_bytes(path, model.SerializeToString())
    import onnx  # host only; the external-data path is rare (encoder widths of 320+ with the gathers)

    path = Path(path)
    data_name = f"{path.name}.data"
    with replacing(path.parent / data_name) as data_tmp, replacing(path) as tmp:
        onnx.save(model, str(tmp), save_as_external_data=True, location=data_tmp.name)
        # the graph names its data file by the temporary name; rename it to the final one
        fixed = onnx.load(str(tmp), load_external_data=False)
        for t in fixed.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = data_name
        tmp.write_bytes(fixed.SerializeToString())
    return path
