"""Build outputs (ONNX slices, engines, logs, audio) live outside git, keyed by the content that made
them, and are written through rkstudy.atomic, so a partial file is never picked up: an entry either
exists whole under its final name or does not exist.

Board side: standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from . import atomic
from .paths import cache_root


def cache_dir(*parts: str) -> Path:
    """`<cache root>/<parts>`, created on demand."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digest(*parts) -> str:
    """A short stable key over files (by content), bytes and JSON-able values."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(sha256_file(part).encode())
        elif isinstance(part, bytes):
            h.update(part)
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def entry(kind: str, name: str, key: str, suffix: str) -> Path:
    """The path of a cache entry: `<cache>/<kind>/<name>-<key><suffix>`."""
    return cache_dir(kind) / f"{name}-{key}{suffix}"


def cached_bytes(kind: str, name: str, data: bytes, suffix: str) -> Path:
    """Store `data` under a name keyed by its own digest (written once, atomically)."""
    path = entry(kind, name, digest(data), suffix)
    if not path.exists():
        atomic.write_bytes(path, data)
    return path


@contextlib.contextmanager
def locked(path: Path | str) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` (created beside it): the second of two processes that
    would make the same entry waits for the first, then finds the entry made. The kernel drops the
    lock when its holder dies, so a killed maker blocks nobody."""
    lock = Path(str(path) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_file(kind: str, name: str, key: str, suffix: str, make: Callable[[Path], None]) -> Path:
    """The entry for `key`, made by `make(tmp_path)` when it is missing (once, when two processes ask
    at the same time). `make` writes a temporary file that is renamed into place only when it
    returns, so a killed maker leaves no entry."""
    path = entry(kind, name, key, suffix)
    if not path.exists():
        with locked(path):
            if not path.exists():
                with atomic.replacing(path) as tmp:
                    make(tmp)
    return path


def _note_path(path: Path | str) -> Path:
    return Path(str(path) + ".made.json")


def note_made(path: Path | str, **facts) -> None:
    """Keep beside a cache entry what making it measured (node counts, seconds): a study that takes
    the entry from the cache reads the same row as the study that made it, whichever ran first. Written
    after the entry, so an entry without its note is made again (made_note returns None)."""
    atomic.write_text(_note_path(path), json.dumps(facts, sort_keys=True) + "\n")


def made_note(path: Path | str, *keys: str) -> dict | None:
    """What note_made kept beside `path`, when it holds every one of `keys`; else None."""
    try:
        facts = json.loads(_note_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) and set(keys) <= set(facts) else None
