"""`rkstudy doctor`: what this environment is, and what to fix when the converter side is broken.

Board side: `rkstudy doctor --board` imports nothing of the converter. It checks what pip cannot:
that rknnlite imports, librknnrt.so where RKNNLite loads it (and what sudo would drop) and its version,
the NPU driver, access to the NPU's device node, and (with --engine, a file or the folder of one engine
per SoC) the check `rkstudy board run` makes before any init (rkstudy.board.compat.check_engine): the
engine is this SoC's, and this board's librknnrt is not older than the toolkit that compiled it.

The toolkit's own pins (torch<=2.4.0, an old onnx) cannot be resolved on a current Python
without a multi-GB CUDA torch, so this project installs it with --no-deps over pins of its own.
That works only while those pins hold; this check says which one broke and how to fix it.
"""

from __future__ import annotations

import grp
import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from . import __version__
from .board import check, compat, sysfs
from .board.runner import board_available, rknnlite_problem
from .errors import EngineMismatch, InputError

PACKAGES = ("torch", "numpy", "onnx", "onnxruntime", "onnxslim", "protobuf", "setuptools",
            "rknn-toolkit2", "rknn-toolkit-lite2")
FIX_ENV = "make venv   (or: pip install -e '.[converter]' && pip install --no-deps rknn-toolkit2==2.5.0)"


@dataclass
class Check:
    ok: bool
    what: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, int]:
    parts = (version.split("+")[0].split(".") + ["0"])[:2]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)


def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "machine": platform.machine(),
            "rkstudy": __version__, **{p: _version(p) for p in PACKAGES}}


def converter_findings(v: dict[str, str | None]) -> list[Check]:
    """Checks for the host side (export, convert, simulate). Each failing one names its fix."""
    out = []
    if v["rknn-toolkit2"] is None:
        out.append(Check(False, "rknn-toolkit2 is not installed", "make toolkit (or pip install --no-deps "
                           "rknn-toolkit2==2.5.0 after the converter extra)"))
    else:
        out.append(Check(True, f"rknn-toolkit2 {v['rknn-toolkit2']}"))
    onnx_v = v["onnx"]
    if onnx_v is None:
        out.append(Check(False, "onnx is not installed", "pip install onnx==1.18.0"))
    elif _major_minor(onnx_v) >= (1, 19):
        out.append(Check(False, f"onnx {onnx_v} removed onnx.mapping, which the toolkit imports",
                           "pip install onnx==1.18.0"))
    else:
        out.append(Check(True, f"onnx {onnx_v}"))
    st = v["setuptools"]
    if st is None or _major_minor(st) >= (81, 0):
        out.append(Check(False, f"setuptools {st} has no pkg_resources, which the toolkit imports",
                           "pip install 'setuptools<81'"))
    else:
        out.append(Check(True, f"setuptools {st}"))
    np_v = v["numpy"]
    if np_v is None or _major_minor(np_v) >= (2, 0):
        out.append(Check(False, f"numpy {np_v}: the toolkit is built against numpy 1.x",
                           "pip install numpy==1.26.4 'ml-dtypes<0.6'"))
    else:
        out.append(Check(True, f"numpy {np_v}"))
    if v["torch"] is None:
        out.append(Check(False, "torch is not installed (the toolkit imports it)",
                           "pip install torch==2.13.0 (the CPU build)"))
    else:
        out.append(Check(True, f"torch {v['torch']}"))
    if v["rknn-toolkit2"] and all(f.ok for f in out):
        try:  # the import itself is the last word: it fails on any pin we did not think of
            from rknn.api import RKNN  # noqa: F401
            out.append(Check(True, "rknn.api imports"))
        except Exception as exc:  # noqa: BLE001 - report whatever the toolkit raised
            out.append(Check(False, f"rknn.api does not import: {type(exc).__name__}: {exc}", FIX_ENV))
    return out


FIX_LIBRKNNRT = ("install the RKNPU2 runtime: librknnrt.so from rknn-toolkit2's rknpu2/runtime/Linux/librknn_api/"
                 "aarch64/ (the release matching the compiler, 2.5.0) into /usr/lib, or set LIBRKNNRT_PATH")


def _device_finding() -> Check:
    nodes = sysfs.npu_device_nodes()
    if not nodes:
        return Check(False, "no NPU device node (a /dev/dri/renderD* of the rknpu driver, or /dev/rknpu)",
                       "load the rknpu driver (vendor kernel: dmesg | grep -i rknpu) and check ls -l /dev/dri")
    from .paths import on_board

    denied = [n for n in nodes if not os.access(on_board(n), os.R_OK | os.W_OK)]
    if not denied:
        return Check(True, f"NPU device {', '.join(nodes)} readable and writable by this user")
    st = on_board(denied[0]).stat()
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return Check(False, f"NPU device {denied[0]} (group {group}, mode {st.st_mode & 0o777:o}) is not readable "
                   "and writable by this user", f"sudo usermod -aG {group} $USER, then log in again (or run as root)")


def engine_findings(engine, runtime: str | None) -> list[Check]:
    """The engine's contract (bytes, this board's SoC) and its compiler against this board's librknnrt: the
    check `rkstudy board run` makes before any init. A folder (one engine per SoC) checks the ones this
    SoC runs."""
    from .contract import for_engine

    soc = sysfs.soc()
    try:  # a folder: the engines a board run here would take from it (this SoC's, newest runnable toolkit)
        engines = compat.this_boards([engine], soc=soc, runtime=runtime) if soc else compat.engine_files([engine])
    except InputError as exc:  # EngineMismatch too: no engine for this SoC, a contract that does not read
        return [Check(False, str(exc))]
    out = []
    for path in engines:
        name = os.path.basename(path)
        try:
            c = for_engine(path, soc=soc)
        except EngineMismatch as exc:
            out.append(Check(False, f"engine {name}: {exc}"))
            continue
        out.append(Check(True, f"engine {name}: compiled for {c.target} by {c.toolkit}"))
        built, rt = compat.release(c.toolkit), compat.release(runtime)
        refusal = compat.too_old(c, runtime or "", soc)
        if runtime is None:  # no librknnrt: its own finding above names the fix
            continue
        if built is None or rt is None:
            out.append(Check(False, f"cannot compare the engine's toolkit ({c.toolkit}) with librknnrt "
                               f"({runtime or '-'})", FIX_LIBRKNNRT))
        elif refusal:
            said, fix = refusal.split(" Fix: ", 1)
            out.append(Check(False, said, fix))
        else:
            newer = " (newer than the compiler: runtimes read older engines)" if rt > built else ""
            out.append(Check(True, f"librknnrt {runtime} runs engines from {c.toolkit}{newer}"))
    return out


def _runtime_finding() -> Check:
    """librknnrt where RKNNLite loads it, and what sudo would do to a runtime found through LIBRKNNRT_PATH."""
    runtime, path = check.librknnrt()
    if runtime is None:
        return Check(False, *compat.missing_runtime_parts())
    lite = _version("rknn-toolkit-lite2")
    older = (f"; older than rknn-toolkit-lite2 {lite}: check an engine with --engine"
             if compat.release(lite) and compat.release(runtime) and compat.release(runtime) < compat.release(lite)
             else "")
    env = os.environ.get(check.LIBRKNNRT_ENV)
    if env and check.library_version(check.LIBRKNNRT_DEFAULT) != runtime:
        return Check(True, f"librknnrt {runtime} ({path}, through {check.LIBRKNNRT_ENV}{older})",
                     f"sudo drops {check.LIBRKNNRT_ENV} (and the NPU load needs root): run `sudo env "
                     f"{check.LIBRKNNRT_ENV}={env} rkstudy ...`, or copy it to {check.LIBRKNNRT_DEFAULT}")
    return Check(True, f"librknnrt {runtime} ({path}{older})")


def board_findings(engine=None) -> list[Check]:
    """What a board needs beyond pip: rknnlite importing, librknnrt, the driver, the device node, and
    (given an engine) the engine against this board's runtime."""
    problem = rknnlite_problem()
    out = [Check(problem is None, problem or "rknnlite imports",
                   "" if problem is None else "make board-env (or pip install -e '.[board]')")]
    runtime, _ = check.librknnrt()
    out.append(_runtime_finding())
    driver, source, _ = sysfs.npu_driver()
    out.append(Check(True, f"rknpu driver {driver} ({source})") if driver else
               Check(False, f"no rknpu driver version ({', '.join(sysfs.NPU_VERSION_FILES)})",
                       "load the rknpu driver of the vendor kernel (dmesg | grep -i rknpu; sudo modprobe rknpu)"))
    out.append(_device_finding())
    if engine is not None:
        out += engine_findings(engine, runtime)
    return out


def _finding_lines(findings: list[Check]) -> tuple[list[str], int]:
    lines, code = [], 0
    for f in findings:
        lines.append(f"  [{'ok' if f.ok else 'FAIL'}] {f.what}" + (f"\n         fix: {f.fix}" if f.fix else ""))
        code |= 0 if f.ok else 1
    return lines, code


def family_lines(side: str) -> list[str]:
    """Each registered family and whether its side can run here."""
    import importlib.util

    from .registry import load_all

    lines = ["", "families:"]
    families = load_all()
    width = max(len(name) for name in families) + 1
    for f in families.values():
        if side == "board":
            what = f"`rkstudy board run {f.name}`" if f.board else "host only"
        else:
            missing = [m for m in f.requires if importlib.util.find_spec(m) is None]
            what = f"missing {', '.join(missing)} (make models)" if missing else "ready"
        lines.append(f"  {f.name:<{width}} {what}")
    return lines


def report(side: str = "converter", engine=None) -> tuple[str, int]:
    """The doctor's text and exit code (non-zero when the asked-for side is broken)."""
    v = versions()
    lines = ["rkstudy doctor", "", "versions:"]
    lines += [f"  {k:<20} {val if val is not None else '-'}" for k, val in v.items()]
    present, why = board_available()
    lines += ["", f"board runtime: {'present' if present else 'absent'} ({why})"]
    if present:
        clock = sysfs.npu_clock()
        lines.append(f"  SoC {sysfs.soc() or 'unknown'}; NPU governor {clock['governor']}, cur_freq "
                     f"{clock['cur_freq']} (board figures scale with this clock)")
    if side == "converter":
        lines += ["", "converter environment:"]
        found, code = _finding_lines(converter_findings(v))
    else:
        lines += ["", "board environment:"]
        found, code = _finding_lines(board_findings(engine))
    lines += found
    lines += family_lines(side)
    lines.append("")
    again = "rkstudy doctor" + (" --board" if side == "board" else "")
    lines.append("OK" if code == 0 else f"BROKEN: apply the fixes above, then rerun `{again}`.")
    return "\n".join(lines), code


def main(side: str = "converter", engine=None) -> int:
    text, code = report(side, engine)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
