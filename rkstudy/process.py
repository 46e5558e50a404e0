"""What a process measures of itself (its own peak resident set), and how it speaks when its output is
kept for readers (a recorded run: progress lines off, warnings without this machine's paths).

Both measured children read it the same way: a board run's child (rkstudy.board.run) and a toolkit
build child (rkstudy.toolkit._child) each report it to the parent that started them.

Board side: standard library only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path


def peak_rss_kb() -> int:
    """This process's own peak resident set (VmHWM, kB) since its exec; 0 where /proc has none.

    The measured children report it themselves: wait4's ru_maxrss is floored by the parent's
    high-water mark (a fork/vfork child inherits it at exec), so it is not the child's own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


# Set by `make reproduce` and the notebook tests for the notebooks they execute: their outputs are kept
# for readers (results/notebooks/, build/quick-notebooks/), who read them on another machine.
RECORDED = "RKSTUDY_RECORDED"


def recorded() -> bool:
    """Whether this process's output is kept for readers: an executed notebook's, not a person's terminal."""
    return os.environ.get(RECORDED, "") not in ("", "0")


def shows_progress(progress: bool = True) -> bool:
    """Whether a long step shows its tqdm line: as the caller asks, and never in a recorded run, where
    each refresh of the bar would be one more stream in the executed notebook."""
    return progress and not recorded()


def short_path(filename: str) -> str:
    """A source file as a reader elsewhere can find it: inside an installed package from the package
    on (torch/onnx/utils.py), inside this repository from its root (rkstudy/gates.py), else its name."""
    from .paths import REPO

    text = str(filename)
    if "site-packages/" in text:
        return text.rsplit("site-packages/", 1)[1]
    try:
        return str(Path(text).resolve().relative_to(REPO))
    except ValueError:
        return Path(text).name


# What the libraries the producers call print on every export that says nothing about the study, by name:
# (the start of its message, a regular expression as `warnings.filterwarnings` takes it, or the logger that
# logs it; why it is harmless here). known_warnings() silences exactly these at the call that raises them, so
# any other warning still reaches the reader.
KNOWN_WARNINGS = {
    "slice-folding": (r"Constant folding - Only steps=1 can be constant folded",
                      "torch's TorchScript exporter leaves a Slice with a step other than 1 to the graph; "
                      "rkstudy.graph.fold folds every graph at its pinned shapes before a build, that Slice with it"),
    "traced-shape": (r"Converting a tensor to a Python (float|integer|boolean) might cause the trace to be incorrect",
                     "a window's frame count read as a number while tracing: each graph is exported at the one "
                     "pinned shape its engine runs, so the constant the trace records is the right one"),
    "weight-norm": (r"`torch\.nn\.utils\.weight_norm` is deprecated",
                    "the vocoder packages build their convolutions with torch's older weight norm; the export "
                    "traces the weight it computes, which both forms compute alike"),
    "instance-norm-train": (r".*operator 'instance_norm' is set to train=True",
                            "an InstanceNorm1d without running statistics normalizes by each input's own statistics "
                            "in training and evaluation alike: the exported graph computes what the module does"),
    "torchvision": ("logger:torch.onnx._internal.exporter._registration",
                    "the dynamo exporter looks up torchvision's detection ops (nms, roi_align) to register them; "
                    "no vocoder graph holds one, so their absence changes no export"),
}


class _DropRecords:
    """A logging filter that drops every record (a logger's lines KNOWN_WARNINGS names as harmless)."""

    def filter(self, record) -> bool:
        return False


@contextlib.contextmanager
def known_warnings(*names: str):
    """Silence the KNOWN_WARNINGS `names` while the block runs, nothing else."""
    import logging
    import warnings

    unknown = [n for n in names if n not in KNOWN_WARNINGS]
    if unknown:
        raise KeyError(f"{', '.join(unknown)}: not in rkstudy.process.KNOWN_WARNINGS ({', '.join(KNOWN_WARNINGS)})")
    loggers = [logging.getLogger(KNOWN_WARNINGS[n][0].removeprefix("logger:")) for n in names
               if KNOWN_WARNINGS[n][0].startswith("logger:")]
    dropping = _DropRecords()
    with warnings.catch_warnings():
        for n in names:
            if not KNOWN_WARNINGS[n][0].startswith("logger:"):
                warnings.filterwarnings("ignore", message=KNOWN_WARNINGS[n][0])
        for logger in loggers:
            logger.addFilter(dropping)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(dropping)


def for_readers() -> None:
    """In a recorded run, a warning prints as one line naming its source file the way short_path does
    (never this machine's absolute paths), and tqdm's note that the kernel has no widget library, which
    says nothing about the study, is not printed."""
    import warnings

    def one_line(message, category, filename, lineno, line=None):
        return f"{category.__name__}: {message} ({short_path(filename)}:{lineno})\n"

    def show(message, category, filename, lineno, file=None, line=None):
        print(one_line(message, category, filename, lineno).rstrip("\n"), file=file or sys.stderr)

    warnings.formatwarning = one_line
    warnings.showwarning = show
    warnings.filterwarnings("ignore", message="IProgress not found")


# --- the machine a number was measured on --------------------------------------------------------------
# ARM "CPU part" ids (/proc/cpuinfo) of the cores the Rockchip SoCs carry.
CPU_PARTS = {"0xd05": "Cortex-A55", "0xd0b": "Cortex-A76", "0xd04": "Cortex-A35", "0xd03": "Cortex-A53",
             "0xd08": "Cortex-A72"}
# The widest vector extension first: what a library that picks its kernels by the CPU it finds would take.
X86_ISA = (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"), ("sse4.2", "sse4_2"))

# Libraries whose kernels are chosen by the CPU they find, each held to the AVX2 code path (the widest one an
# AVX2-only host has, so an AVX-512 host computes as that host does). Measured on an AMD EPYC with AVX-512
# (torch 2.13, numpy 1.26.4): with ONEDNN_MAX_CPU_ISA an fp32 conv1d's bytes change (oneDNN's AVX-512 kernels
# round otherwise), with OPENBLAS_CORETYPE a float64 numpy matmul's do; the others changed no op probed
# (torch's sin/exp/tanh/LSTM/matmul, numpy's transcendentals, sums and FFT) but name the same choice for
# the code paths not probed. onnxruntime (MLAS) and the toolkit's simulator, which runs its engines through
# onnxruntime, pick their kernels by CPUID with no variable or session option to pin them: their numbers
# still move with the vector ISA (a simulator SNR by up to 1.1 dB between an AVX2-only and an AVX-512 host),
# which the tolerances of `rkstudy results diff` hold.
PINNED_NUMERICS = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",       # torch's convolutions (oneDNN)
    "ATEN_CPU_CAPABILITY": "avx2",      # torch's own vectorized kernels
    "MKL_CBWR": "AVX2",                 # torch's BLAS (MKL): conditional numerical reproducibility
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",     # numpy's and scipy's BLAS (OpenBLAS): the AVX2 kernels
    # numpy's own dispatched loops; a feature the machine lacks is ignored (numpy warns on import, quietly)
    "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL",
}


def pinned_environment() -> dict[str, str]:
    """The variables that hold this machine's numerics to PINNED_NUMERICS' code paths, for a child that makes
    tables (they act only when set before the libraries load). Empty off x86: the paths named are x86's."""
    import platform

    return dict(PINNED_NUMERICS) if platform.machine().lower() in ("x86_64", "amd64") else {}


def numerics_pinned(environ=None) -> str:
    """What this process's environment pins of PINNED_NUMERICS: `avx2` when every variable holds its pinned
    value, `none` when none is set, else the variables set, as `NAME=value` (a partial or other pin)."""
    environ = os.environ if environ is None else environ
    found = {k: environ[k] for k in PINNED_NUMERICS if environ.get(k)}
    if not found:
        return "none"
    if found == PINNED_NUMERICS:
        return "avx2"
    return " ".join(f"{k}={v}" for k, v in sorted(found.items()))


def cpu_model(cpuinfo: str) -> str:
    """The CPU `/proc/cpuinfo` describes: x86's model name, or an ARM SoC's cores by type, A55s first as
    the kernel numbers them ("4x Cortex-A55 + 4x Cortex-A76"); `unknown` when it says neither."""
    models, parts = [], []
    for line in cpuinfo.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "model name":
            models.append(value)
        elif key == "CPU part":
            parts.append(CPU_PARTS.get(value.lower(), f"part {value}"))
    if models:
        return models[0]
    if parts:
        counts: dict[str, int] = {}
        for part in parts:
            counts[part] = counts.get(part, 0) + 1
        return " + ".join(f"{n}x {part}" for part, n in counts.items())
    return "unknown"


def vector_isa(cpuinfo: str) -> str:
    """The widest vector extension the CPU reports: on x86 avx512, avx2, avx, sse4.2 or sse2 (the flags of the
    first CPU); on ARM asimd (NEON) with what a kernel may use beside it (+dotprod, +fp16, sve, sve2)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key in ("flags", "Features"):
            flags = set(value.split())
            break
    if not flags:
        return "unknown"
    if "asimd" in flags or "neon" in flags:
        extra = [name for name, flag in (("dotprod", "asimddp"), ("fp16", "asimdhp"), ("sve", "sve"), ("sve2", "sve2"))
                 if flag in flags]
        return "+".join(["asimd", *extra])
    return next((name for name, flag in X86_ISA if flag in flags), "sse2")


def threads(environ=None) -> int:
    """The threads a run's numerical libraries were given: $OMP_NUM_THREADS where set (torch, OpenBLAS, the
    toolkit's OpenMP loops and rkstudy's DNSMOS session read it), else the cores this process may run on."""
    environ = os.environ if environ is None else environ
    try:
        cap = int(environ.get("OMP_NUM_THREADS") or 0)
    except ValueError:
        cap = 0
    if cap > 0:
        return cap
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=8)
def cpu(cpuinfo_path: str = "/proc/cpuinfo") -> tuple[str, str]:
    """(CPU model, vector ISA) as `cpuinfo_path` describes them (a board's, under its sysroot, for a board
    row); read once per process and file: a CPU does not change under a run."""
    try:
        cpuinfo = Path(cpuinfo_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    return cpu_model(cpuinfo), vector_isa(cpuinfo)


def machine(cpuinfo_path: Path | str = "/proc/cpuinfo") -> dict[str, object]:
    """The machine columns of a results row: its CPU and vector ISA (from `cpuinfo_path`), and the thread
    count and pinned numerics of this process's environment."""
    model, isa = cpu(str(cpuinfo_path))
    return {"machine_cpu": model, "machine_isa": isa, "machine_threads": threads(),
            "numerics_pinned": numerics_pinned()}
