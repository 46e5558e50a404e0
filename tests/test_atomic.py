"""The one write policy: a writer killed halfway leaves the old file (or no entry), never a partial one."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rkstudy import atomic, cache

# A writer that streams 64 blocks through rkstudy.atomic, announcing each, slowly enough to be killed.
WRITER = """
import sys, time
from pathlib import Path
from rkstudy import atomic, cache
mode, target = sys.argv[1], sys.argv[2]
def slow(tmp):
    with open(tmp, "wb") as fh:
        for i in range(64):
            fh.write(bytes([i % 251]) * 65536); fh.flush()
            print("block", i, flush=True); time.sleep(0.05)
if mode == "replace":
    with atomic.replacing(target) as tmp:
        slow(tmp)
else:
    print(cache.cached_file("test", "entry", "k1", ".bin", slow), flush=True)
"""


def kill_halfway(mode: str, target: str, env) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, mode, target], stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.startswith("block 20"):
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_writer_leaves_the_old_file(tmp_path):
    final = tmp_path / "table.csv"
    final.write_bytes(b"the old, complete file")
    kill_halfway("replace", str(final), {**os.environ})
    assert final.read_bytes() == b"the old, complete file"
    atomic.write_bytes(final, b"new")  # the next writer replaces it whole
    assert final.read_bytes() == b"new"


def test_a_killed_cache_writer_leaves_no_entry(tmp_path, monkeypatch):
    env = {**os.environ, "RKSTUDY_CACHE": str(tmp_path)}
    kill_halfway("cache", "", env)
    monkeypatch.setenv("RKSTUDY_CACHE", str(tmp_path))
    entry = cache.entry("test", "entry", "k1", ".bin")
    assert not entry.exists()  # the partial file is under a temporary name the cache never looks up
    made = cache.cached_file("test", "entry", "k1", ".bin", lambda p: p.write_bytes(b"whole"))
    assert made == entry and entry.read_bytes() == b"whole"


def test_an_exception_keeps_the_old_file_and_cleans_up(tmp_path):
    final = tmp_path / "x.bin"
    final.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic.replacing(final) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert final.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]


def test_an_explicit_output_is_always_rewritten(tmp_path):
    final = tmp_path / "slice.onnx"
    final.write_bytes(b"8 bytes!")
    before = time.time()
    atomic.write_bytes(final, b"the new slice")
    assert final.read_bytes() == b"the new slice" and final.stat().st_mtime >= before - 1


# Two makers of one entry started together: the second waits on the entry's lock and finds it made.
MAKER = """
import sys, time
from pathlib import Path
from rkstudy import cache
log = Path(sys.argv[1])
def make(tmp):
    with open(log, "a") as fh:
        fh.write("made\\n")
    time.sleep(0.5)
    tmp.write_bytes(b"whole")
print(cache.cached_file("test", "entry", "k2", ".bin", make).read_bytes().decode(), flush=True)
"""


def test_two_processes_asking_for_one_entry_make_it_once(tmp_path):
    env = {**os.environ, "RKSTUDY_CACHE": str(tmp_path)}
    log = tmp_path / "makes.log"
    procs = [subprocess.Popen([sys.executable, "-c", MAKER, str(log)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["whole", "whole"] and log.read_text() == "made\n"
