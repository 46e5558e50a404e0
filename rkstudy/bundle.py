"""`rkstudy bundle`: one archive a user with only a board copies to it, made on the host.

A board cannot make an engine (the converter, the models and minutes per build are the host's), so whoever has
only a board needs everything made for them: this writes one .tar.gz holding, per model its family declares a
bundle for (Family.bundle, a rkstudy.cliutil.BundlePart), the engines for every SoC a board run serves
(rkstudy.targets.ALL_TARGETS), each with its contract and the fp32 graph it was compiled from beside it (the
board gate's reference), the inputs its board runs read (and, where the fp32 pass is too slow for a board's CPU,
the reference made here: decided per run by timing that pass here, see carry()), a component execution plan per
SoC, the rkstudy source the board installs from
(`make board-env` inside the unpacked folder: no clone), and a short README whose fenced commands are the
walk-through, run by tests/test_bundle.py on every recorded board tree through the replay double of RKNNLite.

Every engine is checked before the archive is written: its contract beside it, the fp32 graph the contract
names beside it with that digest, and one engine per SoC for each family; the archive appears only complete
(rkstudy.atomic). Host only: the host commands build with the toolkit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from . import __version__, atomic
from .cache import sha256_file
from .contract import beside, from_json
from .errors import Failed, InputError, UsageError
from .paths import REPO
from .registry import hooked
from .targets import ALL_TARGETS

NAME = "rkstudy-board"
# A board run's fp32 pass is carried from the host when it would take a board's CPU longer than this many seconds
# per second of audio: more than twice the run it checks
MAX_BOARD_PASS = 2.0
# what the board installs from: the package, its data (the reference documents' figures `board check` compares with,
# the texts) and what `make board-env` reads (pyproject.toml names README.md,
# which the bundle's own README stands in for)
SOURCE = ("rkstudy", "data", "pyproject.toml", "Makefile", "environment-board.yml")
PROMPT = ".venv-board/bin/rkstudy"


def parts(models: list[str] | None = None) -> list:
    """The BundlePart of every model asked for (default: every family that declares one), in registry order."""
    known = {part.model: part for part in (hook() for _, hook in hooked("bundle"))}
    if not models:
        return list(known.values())
    unknown = [m for m in models if m not in known]
    if unknown:
        raise UsageError(f"no bundle for {', '.join(unknown)}; models with one: {', '.join(known)}")
    return [known[m] for m in models]


def copy_source(root: Path) -> None:
    """The rkstudy package and the files `make board-env` reads, without bytecode."""
    for name in SOURCE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, root / name)


def run_host(argv, root: Path) -> None:
    """One host command of a part, in the bundle's folder, as a user's shell runs it; its failure is the bundle's."""
    # run inside the bundle's folder, Python imports the copied package: without this it would write that copy's
    # bytecode into the archive (a board's Python compiles its own)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "rkstudy", *argv], cwd=root, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise Failed(f"the bundle's host step `rkstudy {' '.join(argv)}` failed (exit {proc.returncode}): {said}")
    print(f"  rkstudy {' '.join(argv)}", flush=True)


def engines_of(folder: Path) -> dict[str, dict[str, Path]]:
    """{family: {target: engine}} of a folder's engines, each checked: its contract and its fp32 graph beside it."""
    out: dict[str, dict[str, Path]] = {}
    for engine in sorted(folder.rglob("*.rknn")):
        if not beside(engine).is_file():
            raise InputError(f"{engine.name} has no contract beside it; stage 2 writes both")
        c = from_json(beside(engine).read_text(encoding="utf-8"), where=beside(engine).name)
        graph = engine.parent / c.onnx.file
        if not graph.is_file() or sha256_file(graph) != c.onnx.sha256:
            raise InputError(f"{engine.name}: the fp32 graph its contract names ({c.onnx.file}) is not beside it with "
                             "that digest; stage 2 ships it there")
        out.setdefault(c.family, {})[c.target] = engine
    return out


def carry(chosen: list, root: Path) -> tuple[list, list[str]]:
    """Each part's board runs, each gated on the board or against a reference made here: the run's fp32 pass is
    timed here (`--write-reference`: the job's own seconds over the audio it made), scaled to a board's CPU by
    the factor a part measures (BundlePart.board_cpu), and a pass estimated above MAX_BOARD_PASS seconds per second
    of audio is carried (the reference kept, `--reference` added to the run), else dropped (the board runs it).
    Returns the parts with their board commands so completed, and one line per run saying what was decided."""
    from dataclasses import replace

    from .board.gate import Reference

    measure = next((p.board_cpu for p in parts() if p.board_cpu is not None), None)
    factor, how = measure() if measure else (1.0, "no part measures a board's CPU: taken as this host's")
    said = [f"a board's CPU taken as {factor:.2f} times slower than this host's ({how})"]
    out = []
    for part in chosen:
        board = []
        for k, argv in enumerate(part.board):
            if tuple(argv[:2]) != ("board", "run"):
                board.append(argv)
                continue
            bare = [a for i, a in enumerate(argv) if a != "--audio" and (i == 0 or argv[i - 1] != "--audio")]
            ref = f"inputs/{part.model}_reference_{k}.npz"
            run_host((*bare, "--write-reference", ref), root)
            meta = Reference.load(root / ref).meta
            per_s = meta["fp32_s"] / meta["audio_s"] * factor if meta.get("audio_s") else 0.0
            carried = per_s > MAX_BOARD_PASS
            if carried:
                board.append((*argv, "--reference", ref))
            else:
                (root / ref).unlink()
                board.append(argv)
            said.append(f"`board run {argv[2]}`: its fp32 pass took {meta['fp32_s']:.2f} s here for "
                        f"{meta['audio_s']:.2f} s of audio, about {per_s:.1f} s per second of audio on a board's CPU: "
                        + (f"carried from the host ({ref})" if carried else "run on the board"))
        out.append(replace(part, board=tuple(board)))
    return out, said


def plans(part, engines: dict[str, dict[str, Path]], root: Path) -> list[Path]:
    """The part's plan, one file per SoC (plans/<model>.<soc>.json), each naming that SoC's engines."""
    if part.plan is None:
        return []
    def fill(value, soc: str):
        if isinstance(value, dict):
            return {k: fill(v, soc) for k, v in value.items()}
        if isinstance(value, str) and value.startswith("{engine:"):
            return str(engines[value[len("{engine:"):-1]][soc].relative_to(root))
        return value

    written = []
    for soc in ALL_TARGETS:
        path = root / "plans" / f"{part.model}.{soc}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fill(part.plan, soc), indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written


def readme(chosen: list, engines: dict[str, dict[str, Path]], archive: str, root: Path, carried: list[str]) -> str:
    """The bundle's README: what is in it, and the walk-through (one fenced block of the commands a board runs)."""
    from .tables.results import commit

    folders = sorted({str(e.parent.relative_to(root)) + "/" for by_soc in engines.values() for e in by_soc.values()})
    walk = [f"tar xzf {archive} && cd {NAME}", "make board-env"]
    walk += [f"{PROMPT} doctor --board --engine {folder}" for folder in folders] + [f"{PROMPT} board check"]
    walk += [f"{PROMPT} {' '.join(_quoted(argv))}" for part in chosen for argv in part.board]
    models = "\n".join(f"* {part.model}: {part.says}" for part in chosen)
    families = ", ".join(sorted(engines))
    speak = [p for p in chosen if p.plan is not None]
    plan_line = ("" if not speak else
                 f"\n`plans/` holds each model's component execution plan for each SoC: `rkstudy speak "
                 f"{speak[0].model} --plan plans/{speak[0].model}.<soc>.json ...`\nspeaks a whole text with the plan's "
                 "components on the NPU, once its model's front end is installed (for Piper:\n`.venv-board/bin/pip "
                 "install piper-tts`, and `--voice-onnx voice/en_US-joe-medium.onnx`).\n")
    return f"""# rkstudy board bundle

Made on the host by `rkstudy bundle` (rkstudy {__version__}, commit {commit()}, {time.strftime("%Y-%m-%d")}) for
a board that has nothing else: the engines for {", ".join(ALL_TARGETS)} ({families}), each with its stage contract
and the fp32 graph it was compiled from beside it, the inputs its runs read, and the rkstudy source the board installs.

{models}

On the board (aarch64, Python 3.10, 3.11 or 3.12, make, the rknpu driver loaded and librknnrt in /usr/lib):

```sh
{chr(10).join(walk)}
```

Each `board run` takes this board's engine from the folder, times it in a measured child, then gates it: every window
or step against the fp32 graph beside the engine (or the reference made on the host, `--reference`), at the floor
stage 2 held the simulator to. Below it the run ends with exit 1 and one line naming the worst window, the engine's
REGTASK lines and largest field value, and the fixes; nothing is written. The rows go to `results/board/`.
Where each run's reference comes from was measured when this bundle was made (a pass above {MAX_BOARD_PASS:g} s per
second of audio on a board's CPU is carried from the host):

{chr(10).join("* " + line for line in carried)}

`rkstudy doctor --board` names what is missing (librknnrt, the NPU device's group, python3-venv), and an older
librknnrt than the engines' toolkit is refused with its fixes (`--allow-older-runtime` tries it anyway).
{plan_line}"""


def _quoted(argv) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in argv]


def bundle(out: Path | str, models: list[str] | None = None) -> Path:
    """Make the bundle of `models` (default: all) and write it to `out` (a .tar.gz), atomically."""
    out = Path(out)
    if not out.name.endswith(".tar.gz"):
        raise UsageError(f"--output {out}: the bundle is a .tar.gz (for example {NAME}.tar.gz)")
    chosen = parts(models)
    with tempfile.TemporaryDirectory(prefix="rkstudy-bundle-") as tmp:
        root = Path(tmp) / NAME
        root.mkdir()
        copy_source(root)
        for part in chosen:
            print(f"{part.model}: {part.says}", flush=True)
            for src, dest in part.files:
                (root / dest).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, root / dest)
            for argv in part.host:
                run_host(argv, root)
        engines = engines_of(root / "engines")
        chosen, carried = carry(chosen, root)
        missing = {family: sorted(set(ALL_TARGETS) - set(by_soc)) for family, by_soc in engines.items()
                   if set(ALL_TARGETS) - set(by_soc)}
        if missing:
            raise Failed(f"the bundle lacks engines for {json.dumps(missing)}; every SoC a board run serves needs one")
        for part in chosen:
            plans(part, engines, root)
        (root / "README.md").write_text(readme(chosen, engines, out.name, root, carried), encoding="utf-8")
        with atomic.replacing(out) as tmp_out:
            with tarfile.open(tmp_out, "w:gz") as tar:
                tar.add(root, arcname=NAME)
    count = sum(len(v) for v in engines.values())
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB: {count} engines of {', '.join(sorted(engines))} for "
          f"{', '.join(ALL_TARGETS)}, their fp32 graphs, inputs, plans, the source; its README is the walk-through)")
    return out
