"""Who refused, and how much was asked for: the driver's refusal lines and one failure formatter.

An init that the NPU cannot hold fails at rknn_init with a bare code; the byte count is only in the
kernel log. The RKNN decoder-path document ("The IOVA ceiling") recorded these lines on an
RK3588 (6.1.115-vendor-rk35xx) for engines whose mapping passed ~4 GB:

    RKNPU: failed to allocate IOVA: -12
    rknpu_gem_get_pages: dma map 4710850560 fail
    failed to malloc npu memory, size: 6189218496, flags: 0x2

parse() recovers the requested bytes from such lines (with or without the kernel's timestamp and
device prefix). format_failure() is the one place an RKNN failure becomes a message (the board
runner, the memory query and the ladder all raise through it): it names the runtime code (the
rknn_api.h name, and what the reference documents observed it to mean for -4, -6 and -13), the bytes dmesg
names, and the versions the driver and runtime reported ("Who refused: the versions a failure
names").

RKNNLite 2.5.0 (rknnlite/api/rknn_lite.py) hides the librknnrt code in two ways. An init that fails
raises inside init_runtime, which logs "E Catch exception when init runtime!" and the traceback, whose
last line is the runtime's own "Exception: RKNN init failed. error code: RKNN_ERR_MALLOC_FAIL" (the
code's name, from the name table in its rknn_runtime extension), and returns -1. An init that succeeds
returns set_core_mask's code, which on a single-core NPU is librknnrt's -13, after "The core_mask is
only supported by ...". lite_failures() reads both forms back, names or numbers; rkstudy.board.runner
captures the log around init_runtime for that.

Board side: standard library only (dmesg is run as a command at call time).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# Names and header comments of the librknnrt error codes, from rknn_api.h in
# airockchip/rknn-toolkit2 @ 59a913d172e7f5ff03c9076e2ec7b1b1288ffd08 (SDK V2.3.2),
# rknpu2/runtime/Linux/librknn_api/include/rknn_api.h, lines 100-115.
CODE_NAMES = {
    0: ("RKNN_SUCC", "execute succeed"),
    -1: ("RKNN_ERR_FAIL", "execute failed"),
    -2: ("RKNN_ERR_TIMEOUT", "execute timeout"),
    -3: ("RKNN_ERR_DEVICE_UNAVAILABLE", "device is unavailable"),
    -4: ("RKNN_ERR_MALLOC_FAIL", "memory malloc fail"),
    -5: ("RKNN_ERR_PARAM_INVALID", "parameter is invalid"),
    -6: ("RKNN_ERR_MODEL_INVALID", "model is invalid"),
    -7: ("RKNN_ERR_CTX_INVALID", "context is invalid"),
    -8: ("RKNN_ERR_INPUT_INVALID", "input is invalid"),
    -9: ("RKNN_ERR_OUTPUT_INVALID", "output is invalid"),
    -10: ("RKNN_ERR_DEVICE_UNMATCH", "the device is unmatch"),
    -11: ("RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL", "pre_compile model not compatible with the driver"),
    -12: ("RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION",
          "optimization level not compatible with the driver"),
    -13: ("RKNN_ERR_TARGET_PLATFORM_UNMATCH", "target platform not compatible with this platform"),
}

# What the reference documents observed each code to mean on their board ("Who refused: the versions a failure
# names", "The IOVA ceiling"). The header's names do not say it: -6 reads "model is invalid" but
# was an aperture overrun on a valid model, with other contexts resident.
REFERENCE_MEANING = {
    -4: "the driver refused the init: on RK3588 the IOVA ceiling (one mapping above ~4 GB) or the "
        "per-process budget; dmesg names the bytes",
    -6: "the driver refused the init: an aperture overrun (too many contexts resident), not a bad "
        "model",
    -13: "target-platform mismatch: the .rknn was compiled for another SoC; rebuild it for this one",
}
# -6 with no other context of this process resident cannot be an overrun of what is resident: the runtime
# refused the file itself, as librknnrt 1.5.0 did an engine of a newer toolkit (rockchip-linux/rknn-toolkit2#316).
ALONE_MEANING = {
    -6: "the runtime refused the engine file itself (no other context resident: no aperture overrun): an "
        "engine of a newer rknn-toolkit2 than this librknnrt, or a damaged copy",
}

# What to do about a code (rkstudy's advice, not a reference document's finding): the header's words name no fix.
FIXES = {
    -2: "the NPU did not finish in time: `dmesg | tail`; reboot the board if the NPU stays busy",
    -3: "the NPU device is unavailable: the rknpu driver is not loaded, or a killed run still holds it "
        "(`dmesg | tail`, `ls -l /dev/dri/renderD* /dev/rknpu`); reboot the board if it stays busy",
}
# -1 from a run (not an init: an init's -1 is read from the runtime's own lines)
RUN_FAILED = ("the runtime could not run the engine: `dmesg | tail` names what the driver refused (a driver that "
              "cannot submit jobs prints \"failed to submit\"; `rkstudy board check` names its version), and "
              "`rkstudy lint` on the engine's graph names the patterns known to break on the NPU")

CODES_BY_NAME = {name: code for code, (name, _) in CODE_NAMES.items()}
# The failure lines of RKNNLite 2.5.0's log (format strings in its rknn_runtime extension); the
# code is printed as its RKNN_ERR_* name, or as a number by runtimes that print it bare.
_LITE_FAILURE = re.compile(r"RKNN (init|set core mask) failed\. error code:\s*(-?\d+|RKNN_[A-Z_]+)")
# Every other "... failed. error code: X" / "failed, error code: X" line (setting inputs, getting outputs)
_ANY_FAILURE = re.compile(r"(\w[\w ]*?) failed[.,!]? [Ee]rror code:\s*(-?\d+|RKNN_[A-Z_]+)")
# The exception a traceback in RKNNLite's log ends with
_RAISED = re.compile(r"^(?:E )?(?:Exception|[A-Za-z]+Error): (.+)$", re.MULTILINE)
CORE_MASK_ONLY = "The core_mask is only supported by"
# What the runtime raises when librknnrt.so is neither at $LIBRKNNRT_PATH nor in /usr/lib.
NO_LIBRKNNRT = "Can not find dynamic library on"
# RK3576 has two cores: the runtime swaps a mask naming core 2 for 0_1 (or 0) and says so.
_RK3576_REPLACED = re.compile(r'will be automatically replaced with "NPU_CORE_([0-9_]+)"')

# librknnrt's own lines, which RKNNLite leaves on fd 2 beside its log ("I RKNN: [21:32:53.643] RKNN Runtime
# Information: librknnrt version: 1.3.0 (...)", "E RKNN: [...] Invalid RKNN model version 6": the lines
# of airockchip/rknn-toolkit2#254 and #281); 2.x runtimes write "Information, librknnrt version".
_C_LINE = re.compile(r"^([EWID]) RKNN: \[[^\]]*\] (.*)$", re.MULTILINE)
_C_RUNTIME = re.compile(r"librknnrt version: (\S+(?: \([^)]*\))?)")
MODEL_VERSION = "Invalid RKNN model version"

_DMA_MAP = re.compile(r"rknpu_gem_get_pages: dma map (\d+) fail")
_MALLOC = re.compile(r"failed to malloc npu memory, size: (\d+)(?:, flags: (0x[0-9a-fA-F]+))?")
_IOVA = re.compile(r"failed to allocate IOVA: (-?\d+)")


@dataclass(frozen=True)
class Refusal:
    """One driver refusal line: kind is dma-map, malloc or iova; nbytes the size it asked for."""

    kind: str
    nbytes: int | None
    errno: int | None
    flags: str | None
    line: str

    def short(self) -> str:
        if self.kind == "iova":
            return f"IOVA allocation failed ({self.errno})"
        what = {"dma-map": "dma map", "malloc": "npu malloc"}[self.kind]
        return f"{what} of {self.nbytes} B ({self.nbytes / 1e9:.2f} GB) refused"


def parse(text: str | Iterable[str]) -> list[Refusal]:
    """Every refusal line in `text` (a dmesg dump or its lines), in order."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    out = []
    for line in lines:
        if m := _DMA_MAP.search(line):
            out.append(Refusal("dma-map", int(m.group(1)), None, None, line.strip()))
        elif m := _MALLOC.search(line):
            out.append(Refusal("malloc", int(m.group(1)), None, m.group(2), line.strip()))
        elif m := _IOVA.search(line):
            out.append(Refusal("iova", None, int(m.group(1)), None, line.strip()))
    return out


def refused_bytes(text: str | Iterable[str]) -> list[int]:
    """The byte counts the driver refused, in order."""
    return [r.nbytes for r in parse(text) if r.nbytes is not None]


@dataclass(frozen=True)
class LiteFailure:
    """One failure line of an RKNNLite log: the step (init or set core mask), the code's number (None
    for a name rknn_api.h 2.3.2 does not number, such as 2.5.0's RKNN_ERR_SOC_BIND_FAILED) and name."""

    step: str
    code: int | None
    name: str


def lite_failures(log_text: str) -> list[LiteFailure]:
    """Every librknnrt failure an RKNNLite log names, in order, names or numbers."""
    out = []
    for step, value in _LITE_FAILURE.findall(log_text):
        if value.startswith("RKNN_"):
            out.append(LiteFailure(step, CODES_BY_NAME.get(value), value))
        else:
            code = int(value)
            out.append(LiteFailure(step, code, CODE_NAMES.get(code, ("unknown code", ""))[0]))
    return out


@dataclass(frozen=True)
class RuntimeSaid:
    """What librknnrt itself wrote while a context initialized: its version, and its error lines."""

    version: str | None
    errors: tuple[str, ...]

    @property
    def model_version_refused(self) -> bool:
        """The runtime did not know the engine's model version: an engine of a newer toolkit."""
        return any(MODEL_VERSION in e for e in self.errors)

    def note(self) -> str:
        """Its last error line worth a reader's time, for a failure's one line ("" when it wrote none)."""
        said = [e for e in self.errors if not re.fullmatch(r"[\d, ]+", e) and "load model failed" not in e]
        if not said:
            return ""
        return f"{f'librknnrt {self.version.split()[0]}' if self.version else 'librknnrt'} said \"{said[-1]}\""

    def meaning(self) -> str | None:
        """What the failure is, where the runtime's own lines say it better than the code's name."""
        if self.model_version_refused:
            return ("the engine is from a newer rknn-toolkit2 than this librknnrt: install that toolkit's "
                    "librknnrt into /usr/lib, or build the engine with this runtime's toolkit version (--toolkit)")
        return None


def runtime_said(log_text: str) -> RuntimeSaid:
    """librknnrt's version and error lines in a log captured around an init."""
    version, errors = None, []
    for level, text in _C_LINE.findall(log_text):
        if version is None and (m := _C_RUNTIME.search(text)):
            version = m.group(1)
        if level == "E":
            errors.append(text.strip())
    return RuntimeSaid(version, tuple(errors))


def cores_granted(log_text: str, asked: str) -> str:
    """The core mask a successful init actually runs on: AUTO where the runtime said the mask is not
    supported on this SoC (and went on), RK3576's replacement where it swapped one, else `asked`."""
    if CORE_MASK_ONLY in log_text:
        return "auto"
    m = _RK3576_REPLACED.search(log_text)
    return m.group(1) if m else asked


def read_dmesg(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[str] | None:
    """The kernel log's lines, or None where it cannot be read (dmesg_restrict: run as root)."""
    try:
        proc = run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.splitlines() if proc.returncode == 0 else None


class DmesgWatch:
    """The refusal lines the kernel logged while the `with` block ran.

    `reader` returns the log's lines (this module's read_dmesg, looked up at call time, by default;
    a fake in tests). A log that cannot be read gives no refusals rather than an error: the code is
    still reported.
    """

    def __init__(self, reader: Callable[[], list[str] | None] | None = None):
        self._reader = reader or (lambda: read_dmesg())
        self._before = 0
        self.refusals: list[Refusal] = []

    def __enter__(self) -> DmesgWatch:
        self._before = len(self._reader() or [])
        return self

    def __exit__(self, *exc) -> None:
        lines = self._reader() or []
        self.refusals = parse(lines[self._before:] if len(lines) >= self._before else lines)


@dataclass(frozen=True)
class Versions:
    """The two versions a board can state: librknnrt (api) and the kernel NPU driver."""

    api: str | None = None
    driver: str | None = None

    def describe(self) -> str:
        """"driver 0.9.8, api 2.3.2 (429f97ae6b@...)", the reference documents' order; "" when neither is known."""
        return ", ".join(p for p in (f"driver {self.driver}" if self.driver else "",
                                     f"api {self.api}" if self.api else "") if p)

    def suffix(self) -> str:
        return f" ({self.describe()})" if self.describe() else ""


_SDK_API = re.compile(r"API:\s*(.+)")
_SDK_DRV = re.compile(r"DRV:\s*(.+)")


def parse_lite_sdk_version(text: str | None) -> Versions:
    """RKNNLite.get_sdk_version()'s text ("RKNN VERSION:\\n  API: ...\\n  DRV: ...") as Versions."""
    if not text:
        return Versions()
    api, drv = _SDK_API.search(text), _SDK_DRV.search(text)
    return Versions(api.group(1).strip() if api else None, drv.group(1).strip() if drv else None)


_seen: Versions | None = None  # from the first context this process initialized


def remember_versions(versions: Versions) -> None:
    """Keep the first versions a context reported (RKNN_QUERY_SDK_VERSION is per-context), so the
    failures after it can carry them."""
    global _seen
    if _seen is None and (versions.api or versions.driver):
        _seen = versions


def known_versions() -> Versions | None:
    return _seen


def inference_failure(what: str, log_text: str) -> str:
    """One line for an inference that returned no outputs, from the log RKNNLite and librknnrt wrote meanwhile:
    the code a failure line names (with its fix), the exception RKNNLite caught, and librknnrt's own last error."""
    codes = [(step, value) for step, value in _ANY_FAILURE.findall(log_text)]
    code = None
    if codes:
        value = codes[-1][1]
        code = CODES_BY_NAME.get(value) if value.startswith("RKNN_") else int(value)
    raised = _RAISED.findall(log_text)
    said = runtime_said(log_text).note()
    notes = [f"RKNNLite caught \"{' '.join(raised[-1].split())}\"" if raised else
             "RKNNLite returned no outputs and logged no reason (--debug shows its log)", said]
    if code is None:
        notes.append(RUN_FAILED)
    meaning = f"{CODE_NAMES[-1][1]}; {RUN_FAILED}" if code == -1 else None
    return format_failure(what, code, note="; ".join(n for n in notes if n), meaning=meaning)


def describe_code(code: int, resident: int | None = None, meaning: str | None = None) -> str:
    """`RKNN_ERR_MALLOC_FAIL: <what the reference documents saw it mean>` for a librknnrt code; with
    `resident` 0 (no other context of this process holds the NPU), -6 is said for what it is then;
    `meaning`, where the runtime's own lines said what failed, replaces both."""
    name, header = CODE_NAMES.get(code, ("unknown code", "not in rknn_api.h 2.3.2"))
    meaning = meaning or (ALONE_MEANING.get(code) if resident == 0 else None)
    said = meaning or REFERENCE_MEANING.get(code) or (f"{header}; {FIXES[code]}" if code in FIXES else header)
    return f"{name}: {said}"


def format_failure(what: str, code: int | None, *, versions: Versions | None = None,
                   refusals: Iterable[Refusal] = (), note: str = "", resident: int | None = None,
                   meaning: str | None = None) -> str:
    """One line: what failed, its code and meaning, the bytes dmesg names, and the versions.

    `code` None is a call that returned no code (an inference that returned None). `versions`
    defaults to the ones the first context of this process reported; without any, the line carries
    none (the first engine of a process can fail before any context reported). `resident` is how many
    other contexts of this process were initialized (None: not known), which decides what -6 means;
    `meaning` is what the runtime's own lines said the failure is (RuntimeSaid.meaning).
    """
    versions = versions if versions is not None else (known_versions() or Versions())
    details = [describe_code(code, resident, meaning)] if code is not None else []
    details += [note] if note else []
    details += [f"dmesg: {'; '.join(r.short() for r in refusals)}"] if refusals else []
    head = f"{what} failed" + (f" with code {code}" if code is not None else "")
    return head + (f" ({'; '.join(details)})" if details else "") + versions.suffix()


class RknnError(RuntimeError):
    """An RKNN call failed; the message is format_failure's line (exit 1 on the command line)."""


class InitRefused(RknnError):
    """The runtime or driver refused to initialize a context; `code` is the librknnrt code, `log` what
    RKNNLite and librknnrt wrote meanwhile. The ladder (rkstudy.board.memory) evicts and retries on this,
    and on nothing else."""

    log = ""

    def __init__(self, what: str, code: int | None, *, versions: Versions | None = None,
                 refusals: Iterable[Refusal] = (), note: str = "", resident: int | None = None,
                 meaning: str | None = None):
        self.code = code
        self.refusals = list(refusals)
        super().__init__(format_failure(what, code, versions=versions, refusals=self.refusals, note=note,
                                        resident=resident, meaning=meaning))
