"""`rkstudy doctor`: what this environment is, and what to fix when the converter side is broken.

Board side: `rkstudy doctor --board` imports nothing of the converter (only importlib.metadata
looks the packages up).

The toolkit's own pins (torch<=2.4.0, an old onnx) cannot be resolved on a current Python
without a multi-GB CUDA torch, so this project installs it with --no-deps over pins of its own.
That works only while those pins hold; this check says which one broke and how to fix it.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from importlib import metadata

from . import __version__
from .board import sysfs
from .runtime.board import board_available

PACKAGES = ("torch", "numpy", "onnx", "onnxruntime", "onnxslim", "protobuf", "setuptools",
            "rknn-toolkit2", "rknn-toolkit-lite2")
FIX_ENV = "make venv   (or: pip install -e '.[converter]' && pip install --no-deps rknn-toolkit2==2.5.0)"


@dataclass
class Finding:
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


def converter_findings(v: dict[str, str | None]) -> list[Finding]:
    """Checks for the host side (export, convert, simulate). Each failing one names its fix."""
    out = []
    if v["rknn-toolkit2"] is None:
        out.append(Finding(False, "rknn-toolkit2 is not installed", "make toolkit (or pip install --no-deps "
                           "rknn-toolkit2==2.5.0 after the converter extra)"))
    else:
        out.append(Finding(True, f"rknn-toolkit2 {v['rknn-toolkit2']}"))
    onnx_v = v["onnx"]
    if onnx_v is None:
        out.append(Finding(False, "onnx is not installed", "pip install onnx==1.18.0"))
    elif _major_minor(onnx_v) >= (1, 19):
        out.append(Finding(False, f"onnx {onnx_v} removed onnx.mapping, which the toolkit imports",
                           "pip install onnx==1.18.0"))
    else:
        out.append(Finding(True, f"onnx {onnx_v}"))
    st = v["setuptools"]
    if st is None or _major_minor(st) >= (81, 0):
        out.append(Finding(False, f"setuptools {st} has no pkg_resources, which the toolkit imports",
                           "pip install 'setuptools<81'"))
    else:
        out.append(Finding(True, f"setuptools {st}"))
    np_v = v["numpy"]
    if np_v is None or _major_minor(np_v) >= (2, 0):
        out.append(Finding(False, f"numpy {np_v}: the toolkit is built against numpy 1.x",
                           "pip install numpy==1.26.4 'ml-dtypes<0.6'"))
    else:
        out.append(Finding(True, f"numpy {np_v}"))
    if v["torch"] is None:
        out.append(Finding(False, "torch is not installed (the toolkit imports it)",
                           "pip install torch==2.13.0 (the CPU build)"))
    else:
        out.append(Finding(True, f"torch {v['torch']}"))
    if v["rknn-toolkit2"] and all(f.ok for f in out):
        try:  # the import itself is the last word: it fails on any pin we did not think of
            from rknn.api import RKNN  # noqa: F401
            out.append(Finding(True, "rknn.api imports"))
        except Exception as exc:  # noqa: BLE001 - report whatever the toolkit raised
            out.append(Finding(False, f"rknn.api does not import: {type(exc).__name__}: {exc}", FIX_ENV))
    return out


def family_lines(side: str) -> list[str]:
    """Each registered family and whether its side can run here."""
    import importlib.util

    from .families import load_all

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


def report(side: str = "converter") -> tuple[str, int]:
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
    code = 0
    if side == "converter":
        lines += ["", "converter environment:"]
        for f in converter_findings(v):
            lines.append(f"  [{'ok' if f.ok else 'FAIL'}] {f.what}" + (f"\n         fix: {f.fix}" if f.fix else ""))
            code |= 0 if f.ok else 1
    elif side == "board" and not present:
        lines.append("  fix: on the board, `make board-env` (or pip install -e '.[board]') and load the rknpu driver")
        code = 1
    lines += family_lines(side)
    lines.append("")
    lines.append("OK" if code == 0 else "BROKEN: apply the fixes above, then rerun `rkstudy doctor`.")
    return "\n".join(lines), code


def main(side: str = "converter") -> int:
    text, code = report(side)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
