"""The replay double of RKNNLite against the real rknn-toolkit-lite2 2.5.0 wheel: the same constants and
method signatures, and every message the double writes is one the real module or its runtime extension
carries. The wheel is aarch64-only, so it is read, never imported: put it in `$RKSTUDY_CACHE/wheels/`
(`pip download rknn-toolkit-lite2==2.5.0 --platform manylinux_2_17_aarch64 --python-version 3.11
--only-binary=:all: --no-deps -d $RKSTUDY_CACHE/wheels`) or name it in $RKNN_TOOLKIT_LITE2_WHEEL."""

import ast
import importlib.util
import inspect
import os
import re
import zipfile
from pathlib import Path

import pytest

from rkstudy.board import dmesg
from rkstudy.paths import cache_root

DOUBLE = Path(__file__).parent / "doubles" / "rknnlite" / "api" / "rknn_lite.py"


def wheel() -> Path | None:
    given = os.environ.get("RKNN_TOOLKIT_LITE2_WHEEL")
    if given:
        return Path(given)
    found = sorted((cache_root() / "wheels").glob("rknn_toolkit_lite2-2.5.0-*.whl"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def real():
    path = wheel()
    if path is None or not path.is_file():
        pytest.skip("the rknn-toolkit-lite2 2.5.0 wheel is not here: put it in $RKSTUDY_CACHE/wheels "
                    "or set RKNN_TOOLKIT_LITE2_WHEEL (see this module's docstring)")
    with zipfile.ZipFile(path) as z:
        source = z.read("rknnlite/api/rknn_lite.py").decode()
        runtime = b"".join(z.read(n) for n in z.namelist() if re.match(r"rknnlite/api/rknn_runtime\..*\.so$", n))
    assert runtime, f"{path.name} has no rknn_runtime extension"
    return source, runtime


@pytest.fixture(scope="module")
def double():
    spec = importlib.util.spec_from_file_location("replay_rknn_lite", DOUBLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _class(source: str) -> ast.ClassDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "RKNNLite")


def _signature(fn: ast.FunctionDef) -> tuple:
    a = fn.args
    return tuple(x.arg for x in a.args), tuple(ast.unparse(d) for d in a.defaults)


def test_constants_and_signatures_match_the_real_module(real, double):
    cls = _class(real[0])
    constants = {t.id: ast.literal_eval(n.value) for n in cls.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name)}
    assert constants == {k: v for k, v in vars(double.RKNNLite).items() if k.startswith("NPU_CORE_")}
    methods = {n.name: _signature(n) for n in cls.body if isinstance(n, ast.FunctionDef)}
    ours = {n.name: _signature(n) for n in _class(DOUBLE.read_text()).body if isinstance(n, ast.FunctionDef)
            and (not n.name.startswith("_") or n.name == "__init__")}
    assert ours == methods


def test_every_message_the_double_writes_is_the_real_ones(real, double):
    source, runtime = real
    for text in (double.INIT_FAILED, double.SET_CORE_MASK_FAILED, double.CORE_MASK_ONLY, double.RK3576_TWO_CORES,
                 double.UNSUPPORTED_DTYPE, double.NO_LIBRARY, double.MISSING_IN_CONTAINER, double.DOWNLOAD_LIBRARY,
                 double.SET_INPUT_SHAPE_FAILED,
                 "!!! Please put it into /usr/lib/ directory."):
        assert text.encode() in runtime, text
    for text in ("Catch exception when init runtime!", "Catch exception when setting inputs."):
        assert text in source, text
    # what it prints for a runtime older than the engine's toolkit: the wheel's failure line with a code from its
    # table, beside librknnrt's own lines, which are the C library's (in no file of the wheel)
    names = {n.decode() for n in re.findall(rb"RKNN_ERR_[A-Z_]+", runtime)}
    assert {"RKNN_ERR_FAIL", "RKNN_ERR_MODEL_INVALID"} <= names
    for text in (double.C_RUNTIME_INFO, double.C_DRIVER_INFO, double.C_MODEL_VERSION, double.C_LOAD_FAILED):
        assert text.split("{")[0].encode() not in runtime and text.split("{")[0] not in source, text
    logged = re.findall(r'_log\("[EWI]", "([^"{]+)', DOUBLE.read_text())
    assert logged and all(m in source for m in logged if m != "*"), logged
    for dtype in double.INPUT_DTYPES:
        assert re.search(rb"\x00" + dtype.encode() + rb"\x00", runtime), dtype


def test_the_error_names_are_the_runtimes_table(real, double):
    names = {n.decode() for n in re.findall(rb"RKNN_ERR_[A-Z_]+", real[1])}
    assert names == set(double.ERROR_NAMES.values()) | set(double.NEW_ERROR_NAMES)
    # and the numbers agree with the header rkstudy names failures from
    assert double.ERROR_NAMES == {code: name for code, (name, _) in dmesg.CODE_NAMES.items() if code < 0}


def test_the_double_is_what_board_code_imports(monkeypatch):
    import sys

    monkeypatch.syspath_prepend(str(DOUBLE.parents[2]))
    for name in [m for m in sys.modules if m == "rknnlite" or m.startswith("rknnlite.")]:
        monkeypatch.delitem(sys.modules, name)
    from rknnlite.api import rknn_lite

    try:
        assert inspect.getsourcefile(rknn_lite) == str(DOUBLE) and rknn_lite.RKNNLite.IS_TEST_DOUBLE
    finally:  # later tests must see this host's own rknnlite (or none), not the double
        for name in [m for m in sys.modules if m == "rknnlite" or m.startswith("rknnlite.")]:
            del sys.modules[name]
