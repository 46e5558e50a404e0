"""Whether this board runs an engine, said before anything initializes: the SoC it was compiled for, and the
board's librknnrt against the rknn-toolkit2 that compiled it; and which engine of a set is this board's.

What librknnrt refuses, from the runtime's own documentation and the logs of the runtimes that refused:
* Rockchip's RKNN SDK release notes (the NPU README of each SDK release, 1.5.2, 1.6.0, 2.0.0b0) say librknnrt
  must be upgraded in step with rknn-toolkit2, to the same release (patch releases such as 1.5.2 included), and
  that engines of the previous toolkit need not be made again: a runtime runs engines of its own release and
  older ones. Neither those notes, nor the runtime's API reference (RKNN_ERR_MODEL_INVALID: "RKNN model is
  invalid"), nor the toolkit's and lite2's changelogs up to 2.3.2 say that a runtime runs an engine of a newer
  toolkit, or that it refuses one.
* The one refusal recorded in the runtime's own words is the engine format of rknn-toolkit2 1.5.2 (the
  pre-compiled model of 1.5.1b2, whose changelog asks to re-export the model and update the runtime):
  librknnrt 1.3.0, 1.4.0 and 1.5.0 refused such engines inside rknn_init with "Invalid RKNN model version 6"
  and RKNN_ERR_FAIL or RKNN_ERR_MODEL_INVALID (airockchip/rknn-toolkit2#254, #281; rockchip-linux/rknn-
  toolkit2#316; a 1.5.2 engine on a 1.5.0 runtime in leafqycc/rknn-cpp-Multithreading#19), where RKNNLite
  hides the reason in a traceback.
* No log this project could find shows a 2.x librknnrt meeting an engine of a newer 2.x toolkit.
So check_engine() refuses, in one line naming both versions and the fixes, a runtime older than the engine's
toolkit release: without appeal where the runtime predates the 1.5.2 format (it refuses at init); by Rockchip's
rule otherwise, where `--allow-older-runtime` runs the engine anyway and the results row records the warning.
The fixes: an engine built by the board's own toolkit version (`make toolkit-venv`, then stage 2 with
`--toolkit`), or that toolkit's librknnrt. `rkstudy board run`, `rkstudy doctor --board --engine` and `rkstudy
speak` call it.

The host builds one engine per SoC in one command (`--target all`); choose() picks this board's from the
set: the engines given (files or folders) whose contract says this family and a target this SoC runs, and
of one compiled graph built by several toolkits, the newest this librknnrt runs.

Board side: standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..contract import Contract, beside, for_engine, from_json, help_for
from ..errors import BoardUnavailable, EngineMismatch, InputError
from ..paths import REPO
from ..targets import runs_engine_for
from . import check, sysfs

# Where the runtime a fix names comes from (the SDK's own copy; its release must be the toolkit's)
RUNTIME_DIR = "rknn-toolkit2's rknpu2/runtime/Linux/librknn_api/aarch64/"
RUNTIME_SOURCE = RUNTIME_DIR + "librknnrt.so"
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_TOOLKITS = re.compile(r"^toolkits\s*=\s*\[([^\]]*)\]", re.MULTILINE)


def release(text: str | None) -> tuple[int, int, int] | None:
    """(2, 5, 0) from "rknn-toolkit2 2.5.0", "2.3.2 (429f97ae6b@...)" or "v0.9.8"; None without one."""
    m = _RELEASE.search(text or "")
    return tuple(int(g) for g in m.groups()) if m else None


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def toolkits() -> list[str]:
    """The rknn-toolkit2 versions a converter environment can be made for ([tool.rkstudy] toolkits in
    pyproject.toml; read with a pattern, as Python 3.10 on a board has no tomllib), [] when unreadable."""
    try:
        m = _TOOLKITS.search((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    except OSError:
        return []
    return re.findall(r'"([^"]+)"', m.group(1)) if m else []


def under_sudo() -> bool:
    """Root through sudo: the environment is sudo's (LIBRKNNRT_PATH and the rest of the user's dropped)."""
    return os.geteuid() == 0 and "SUDO_UID" in os.environ


def missing_runtime_parts() -> tuple[str, str]:
    """(what is missing, the fix) when RKNNLite would find no librknnrt here."""
    env = os.environ.get(check.LIBRKNNRT_ENV)
    looked = f"{check.LIBRKNNRT_ENV}={env}" if env else check.LIBRKNNRT_DEFAULT
    what = f"librknnrt.so is not where RKNNLite loads it ({looked})"
    elsewhere = check.librknnrt_elsewhere()
    if elsewhere:
        return (f"{what}; there is one at {elsewhere[0]}", f"copy it there (sudo cp {elsewhere[0]} "
                f"{check.LIBRKNNRT_DEFAULT}) or set {check.LIBRKNNRT_ENV}={elsewhere[0]}")
    if under_sudo() and not env:
        return (f"{what}, and sudo drops {check.LIBRKNNRT_ENV} from your environment",
                f"run `sudo env {check.LIBRKNNRT_ENV}=/path/to/librknnrt.so rkstudy ...`, or install it into /usr/lib")
    return what, f"install the RKNPU2 runtime ({RUNTIME_SOURCE}, the toolkit's release) into /usr/lib"


def missing_runtime() -> str:
    """Why RKNNLite would find no librknnrt here, and the fix, in one line."""
    what, fix = missing_runtime_parts()
    return f"{what}: {fix} (rkstudy doctor --board checks it)"


def board_runtime() -> tuple[str, str]:
    """(version, path) of the librknnrt RKNNLite would load here; BoardUnavailable naming the fix when
    there is none (under sudo: the dropped LIBRKNNRT_PATH)."""
    version, path = check.librknnrt()
    if version is None:
        raise BoardUnavailable(missing_runtime())
    return version, path


# The engine format rknn-toolkit2 1.5.2 introduced, which older runtimes refuse at init ("Invalid RKNN model version 6")
MODEL_V6_TOOLKIT = (1, 5, 2)
ALLOW_OLDER = "--allow-older-runtime"


def older_runtime(contract: Contract, runtime: str) -> tuple[str, bool] | None:
    """(what is wrong, whether the runtime certainly refuses it) when `runtime` is older than the release of the
    toolkit that compiled `contract`'s engine; None when it is as new, or a version cannot be read (the init
    decides)."""
    built, rt = release(contract.toolkit), release(runtime)
    if built is None or rt is None or rt >= built:
        return None
    engine = contract.engine.file if contract.engine else "this engine"
    if built >= MODEL_V6_TOOLKIT > rt:
        return (f"{engine} is from rknn-toolkit2 {_dotted(built)} and this board's librknnrt {_dotted(rt)} refuses it "
                f"at init: runtimes before {_dotted(MODEL_V6_TOOLKIT)} do not read the engine format rknn-toolkit2 "
                f"{_dotted(MODEL_V6_TOOLKIT)} introduced (\"Invalid RKNN model version 6\")", True)
    return (f"{engine} is from rknn-toolkit2 {_dotted(built)} and this board's librknnrt {_dotted(rt)} is older: "
            f"Rockchip upgrades librknnrt with the toolkit, release for release (older engines keep running), and "
            f"nothing recorded says what {_dotted(rt)} does with a newer engine", False)


def too_old(contract: Contract, runtime: str, soc: str | None = None) -> str | None:
    """The one line refusing `contract`'s engine on a librknnrt `runtime` older than its toolkit (see the module
    docstring), its fixes after " Fix: "; None when the runtime is as new (or a version cannot be read)."""
    older = older_runtime(contract, runtime)
    if older is None:
        return None
    said, certain = older
    built, rt = release(contract.toolkit), release(runtime)
    usable = sorted((release(v) for v in toolkits() if release(v) and release(v) <= rt), reverse=True)
    remake = contract.remake_engine(target=soc or contract.target)
    if usable:
        v = _dotted(usable[0])
        rebuild = f"build for {v}: `make toolkit-venv TOOLKIT={v}`, then `{remake} --toolkit {v}`"
    else:
        rebuild = (f"build with rknn-toolkit2 {_dotted(rt)} or older, a version no converter environment here makes "
                   f"([tool.rkstudy] toolkits: {', '.join(toolkits()) or 'none'})")
    tryit = "" if certain else f", or try it anyway: `rkstudy board run ... {ALLOW_OLDER}` (its row records it)"
    return (f"{said}. Fix: put librknnrt {_dotted(built)} in /usr/lib ({RUNTIME_DIR}), or {rebuild}{tryit}")


def check_engine(contract: Contract, *, soc: str | None = None, runtime: str | None = None,
                 allow_older: bool = False) -> str | None:
    """Refuse, before any init, an engine this board cannot run: compiled for another SoC, or by a toolkit
    newer than this board's librknnrt (EngineMismatch, one line naming both versions and the fixes). With
    `allow_older`, an older runtime that is not known to refuse the engine is let through: the warning for the
    results row is returned. `soc` and `runtime` default to what this board reports; a host with no board checks
    nothing. With no librknnrt where RKNNLite looks, BoardUnavailable names the fix."""
    soc = soc or sysfs.soc()
    if soc is None:
        return None
    contract.check_target(soc)
    if runtime is None:
        runtime, _ = board_runtime()
    older = older_runtime(contract, runtime)
    if older is None:
        return None
    if allow_older and not older[1]:
        return f"{older[0]}; run with {ALLOW_OLDER}"
    refusal = too_old(contract, runtime, soc)
    if allow_older:
        refusal += f" ({ALLOW_OLDER} cannot help: this runtime refuses the engine format)"
    raise EngineMismatch(refusal)


# --- choosing this board's engine from a set ---------------------------------------------------------------
def engine_files(given: Sequence[Path | str]) -> list[Path]:
    """The engines named: each file as given, and every `.rknn` with a contract beside it in a folder."""
    out = []
    for item in map(Path, given):
        if item.is_dir():
            found = sorted(p for p in item.glob("*.rknn") if beside(p).is_file())
            if not found:
                raise InputError(f"no engine with its contract in {item}; stage 2 writes both (`--out {item}`)")
            out += found
        else:
            out.append(item)
    return out


def _read(path: Path, remake: str) -> Contract:
    if not path.is_file():
        raise EngineMismatch(f"no engine at {path}; make one with `{remake}`")
    if not beside(path).is_file():
        raise EngineMismatch(f"no contract beside {path.name} ({beside(path).name}); the conversion stage writes "
                             f"it: make the engine with `{remake}`")
    return from_json(beside(path).read_text(encoding="utf-8"), where=beside(path).name, remake=remake)


def choose(given: Sequence[Path | str], *, family: str, soc: str | None = None, runtime: str | None = None,
           several: bool = False, remake: str | None = None) -> list[Path]:
    """This board's engines among `given` (files or folders): one (a ladder, `several`: one per compiled
    graph) of family `family` compiled for a target this SoC runs; of one graph built by several toolkits,
    the newest this librknnrt runs. Files alone are taken as given where they cannot be a choice (one file,
    or a ladder's rungs, each of which must run here: the caller checks every one, and for_engine says what
    is wrong with it). Refusals are one line naming what was given and the command that makes a matching
    engine."""
    remake = remake or help_for(family, soc)
    paths = engine_files(given)
    if not any(Path(g).is_dir() for g in given) and (len(paths) == 1 or several):
        return paths
    soc = soc or sysfs.soc()
    if runtime is None and soc is not None:
        runtime = check.librknnrt()[0]
    contracts = {p: _read(p, remake) for p in paths}
    ours = {p: c for p, c in contracts.items() if c.family == family}
    if not ours:
        others = sorted({c.family for c in contracts.values()})
        raise EngineMismatch(f"none of the {len(paths)} engines given is a {family} engine (they are "
                             f"{', '.join(others)}); make one with `{remake}`")
    runs = {p: c for p, c in ours.items() if soc is None or runs_engine_for(soc, c.target or "")}
    if not runs:
        targets = sorted({c.target or "none" for c in ours.values()})
        example = next(iter(ours.values()))
        raise EngineMismatch(f"none of the {len(ours)} {family} engines given runs on this {soc} board (compiled for "
                             f"{', '.join(targets)}); convert the graph for it with "
                             f"`{example.remake_engine(target=soc)}` (or --target all)")
    graphs: dict[str, list[Path]] = {}
    for p, c in runs.items():
        graphs.setdefault(c.onnx.sha256 if c.onnx else str(p), []).append(p)
    chosen = [_newest_runnable(group, runs, runtime) for group in graphs.values()]
    if len(chosen) > 1 and not several:
        raise EngineMismatch(f"{len(chosen)} {family} engines given run on this {soc} board, from different graphs "
                             f"({', '.join(p.name for p in chosen)}); pass the one to run with --engine")
    return sorted(chosen)


def this_boards(given: Sequence[Path | str], *, soc: str | None = None, runtime: str | None = None) -> list[Path]:
    """Of the engines given (files or folders), the ones a board run here would take, for every family among
    them (a ladder's every width): what `rkstudy doctor --board --engine` checks."""
    paths = engine_files(given)
    families = sorted({_read(p, "rkstudy --help").family for p in paths})
    return [p for family in families for p in choose(given, family=family, soc=soc, runtime=runtime, several=True)]


def _newest_runnable(group: list[Path], contracts: dict[Path, Contract], runtime: str | None) -> Path:
    """Of one graph's engines (built by different toolkits), the newest toolkit this runtime runs; where
    none is, the oldest (check_engine then says why it cannot run)."""
    def built(p: Path) -> tuple[int, ...]:
        return release(contracts[p].toolkit) or (0, 0, 0)

    rt = release(runtime)
    runnable = [p for p in group if rt is None or built(p) <= rt]
    return max(runnable, key=built) if runnable else min(group, key=built)


def checked(engine: Path | str, *, family: str, soc: str, remake: str | None = None,
            source_sha256: str | None = None, allow_older: bool = False) -> tuple[Contract, str | None]:
    """An engine's contract, validated for this board before anything runs: present, this family, its bytes
    unchanged, this SoC, a librknnrt that runs it (with `allow_older`, an older one not known to refuse it: the
    warning for the row is returned beside the contract), and (given its digest) carved from the inputs' model."""
    contract = for_engine(engine, family=family, soc=soc, remake=remake)
    warning = check_engine(contract, soc=soc, allow_older=allow_older)
    if source_sha256 is not None and source_sha256 != contract.source.sha256:
        raise EngineMismatch(f"the inputs come from a model with sha256 {source_sha256[:12]} and the engine was "
                             f"made from {contract.source.file} ({contract.source.sha256[:12]}); make inputs "
                             f"from {contract.source.file}, or an engine from theirs with `{contract.remake}`")
    return contract, warning
