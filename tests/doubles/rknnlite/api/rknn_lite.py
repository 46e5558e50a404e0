"""A test double of rknn-toolkit-lite2 2.5.0's RKNNLite: its constants, signatures, return codes and log text.

What is taken from the real 2.5.0 module (rknnlite/api/rknn_lite.py, and the strings of its rknn_runtime
extension; tests/test_board_double.py compares them with the wheel when it is present):

* load_rknn reads the file and returns 0 (-1 for a missing path); nothing is validated until init_runtime.
* init_runtime builds the runtime in a try block: any exception is logged as "E Catch exception when init
  runtime!" followed by the traceback, whose last line is the runtime's `Exception: RKNN init failed.
  error code: RKNN_ERR_...` (the code's name, not its number), and -1 is returned. Otherwise it returns
  set_core_mask's code: on a single-core NPU (rk3562, rk3566, rk3568) a mask other than AUTO logs "The
  core_mask is only supported by ..." and librknnrt's rknn_set_core_mask returns -13; on the two-core
  rk3576 a mask naming core 2 is replaced ("NPU_CORE_0_1_2" ... "NPU_CORE_0_1") with a warning.
  Without librknnrt.so ($LIBRKNNRT_PATH, /usr/lib) the runtime's constructor raises "Can not find dynamic
  library on RK3566!" after its warning box (seen running the 2.5.0 wheel under qemu-aarch64).
* inference takes each input with the dtype it has (numpy dtype to tensor type, no cast: an int64 engine
  input must be fed int64); an unsupported dtype or any other failure logs and returns None.
* a multi-shape engine (built with config's dynamic_input): init_runtime's check_dynamic_shape reads the
  engine's shape sets, and set_inputs hands each feed's shapes to rknn_set_input_shapes, so a shape
  outside the sets fails in set_inputs: "Catch exception when setting inputs." and the traceback of the
  extension's "Set input shape failed. error code: {}", then None. The double reads the sets from the
  contract's `shapes` (librknnrt reads them from the engine); the code it names, RKNN_ERR_INPUT_INVALID,
  is its own choice (the wheel holds the message, not the code).

* librknnrt's own lines beside the module's log, written by the C library at rknn_init (the double
  writes them to stderr too): its version and the driver's ("I RKNN: [21:32:53.643] RKNN Runtime
  Information: librknnrt version: 1.3.0 (c193be371@2022-05-04T20:16:33)", "RKNN Driver Information:
  version: 0.7.2"), and, for an engine of a newer rknn-toolkit2 than the runtime, "6, 1", "Invalid RKNN
  model version 6" and "rknn_init, load model failed!", after which init_runtime logs "Catch exception
  when init runtime!" and the traceback ending "Exception: RKNN init failed. error code: RKNN_ERR_FAIL" and
  returns -1. Those lines are from airockchip/rknn-toolkit2#254 and #281 (librknnrt 1.3.0 and 1.4.0,
  "6, 1", RKNN_ERR_FAIL) and rockchip-linux/rknn-toolkit2#316 (librknnrt 1.5.0, "6, 4",
  RKNN_ERR_MODEL_INVALID); the double follows #316 for a runtime of 1.5 and the other two below it, for a
  runtime older than 1.5.2 meeting an engine of rknn-toolkit2 1.5.2 or later (the engine format those runtimes
  refused). A newer runtime older than the engine's toolkit (2.3.2 under a 2.5.0 engine) runs it: what such a
  runtime does was not recorded anywhere this double could read, and rkstudy refuses that pairing itself
  unless told --allow-older-runtime.

Instead of an NPU: init_runtime serves the ONNX the engine was compiled from, found through the engine's
stage contract (`<engine>.contract.json`, beside the engine or in $RKNNLITE_REPLAY_ONNX_DIR, checked by
sha256), with onnxruntime; the SoC, the driver and librknnrt (its version string) are the ones the recorded
board tree under $RKSTUDY_SYSROOT holds. `RKNNLITE_REPLAY_INIT_CODE=-4` makes librknnrt refuse every init
with that code; `RKNNLITE_REPLAY_INIT_SECONDS=N` makes every init take N seconds (an interrupted run).

Faults boards show and the simulator does not (the Piper duration-encoder pull request measured each on a
board), by `RKNNLITE_REPLAY_FAULT`, on every inference of the process or only its Nth
(`RKNNLITE_REPLAY_FAULT_AT=N`, counted from 1 across engines):
* `overflow`: a register-field overflow. Along each output's longest axis, the elements past the field's
  reach are written where the wrapped address points: from `RKNNLITE_REPLAY_FIELD` (default 8192, the 13-bit
  field's span; half the axis where it is shorter) on, the output repeats its own start, a corrupted span;
* `nan-tail`: uninitialised pad memory in the last rows (the last 1/16 of the rows, or of the samples of a
  one-row output) read back as NaN, +65504 and -65504 in turn;
* `zeros`: an all-zero output;
* `segfault`: the runtime crashes inside the inference (SIGSEGV, as the rel-logit chain did: rc=139);
* `submit-fails`: the driver refuses the job: librknnrt's "failed to submit!" (the line a Rock 5B on rknpu
  0.9.3 printed until 0.9.6), then RKNNLite's "Catch exception when running RKNN model." and a traceback, and
  None. The exception's text is the double's own choice (RUN_FAILED, the code by name): the wheel assembles it
  at run time and no log of it was found.
`IS_TEST_DOUBLE` tells rkstudy's BoardRunner to label its rows `replay`. Used only by tests.
"""

import hashlib
import json
import os
import re
import sys
import time
import traceback

import numpy as np

# librknnrt's codes by name, as the rknn_runtime extension prints them (rknn_api.h numbers them).
ERROR_NAMES = {-1: "RKNN_ERR_FAIL", -2: "RKNN_ERR_TIMEOUT", -3: "RKNN_ERR_DEVICE_UNAVAILABLE",
               -4: "RKNN_ERR_MALLOC_FAIL", -5: "RKNN_ERR_PARAM_INVALID", -6: "RKNN_ERR_MODEL_INVALID",
               -7: "RKNN_ERR_CTX_INVALID", -8: "RKNN_ERR_INPUT_INVALID", -9: "RKNN_ERR_OUTPUT_INVALID",
               -10: "RKNN_ERR_DEVICE_UNMATCH", -11: "RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL",
               -12: "RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION", -13: "RKNN_ERR_TARGET_PLATFORM_UNMATCH"}
# added in 2.5.0's table; their numbers are not in the headers this double was written from
NEW_ERROR_NAMES = ("RKNN_ERR_DECRYPT_FAILED", "RKNN_ERR_KEY_INVALID", "RKNN_ERR_SOC_BIND_FAILED")

INIT_FAILED = "RKNN init failed. error code: {}"
SET_INPUT_SHAPE_FAILED = "Set input shape failed. error code: {}"
SET_CORE_MASK_FAILED = "RKNN set core mask failed. error code: {}"
CORE_MASK_ONLY = "The core_mask is only supported by {}. Please do not set this parameter on other platforms."
RK3576_TWO_CORES = ('The RK3576 platform has only two NPU cores. "NPU_CORE_0_1_2" is not supported and will be '
                    'automatically replaced with "NPU_CORE_0_1".')
UNSUPPORTED_DTYPE = "E Unsupport inputs[{}].dtype: {}"
NO_LIBRARY = "Can not find dynamic library on {}!"
MISSING_IN_CONTAINER = "!!! It is detected that {} is missing in the container."
DOWNLOAD_LIBRARY = ("Please download the librknnrt.so from https://github.com/airockchip/rknn-toolkit2/tree/master/"
                    "rknpu2/runtime/Linux/librknn_api/aarch64 and move it to directory /usr/lib/")
# numpy dtypes the runtime maps to tensor types (the names in its extension's strings)
INPUT_DTYPES = ("float32", "float16", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "bool")
MULTI_CORE = ("rk3588", "rk3576")
# librknnrt's lines at rknn_init (the C library's, not the wheel's: see the module docstring for where from)
C_RUNTIME_INFO = "RKNN Runtime Information: librknnrt version: {}"
C_DRIVER_INFO = "RKNN Driver Information: version: {}"
C_MODEL_VERSION = "Invalid RKNN model version {}"
C_LOAD_FAILED = "rknn_init, load model failed!"
MODEL_VERSION = 6  # the engine format rknn-toolkit2 2.x writes, as those runtimes named it
MODEL_V6_TOOLKIT = (1, 5, 2)  # the first toolkit release that wrote it
FAULTS = ("overflow", "nan-tail", "zeros", "segfault", "submit-fails")
C_SUBMIT_FAILED = "failed to submit!"
RUN_FAILED = "rknn_run failed. error code: {}"
FP16_MAX = 65504.0
_inferences = [0]  # inference calls of this process, counted for RKNNLITE_REPLAY_FAULT_AT


def _log(level, message):
    """The real module logs through Python logging as "<level letter> <message>" on stderr."""
    sys.stderr.write(f"{level} {message}\n")
    sys.stderr.flush()


def _board_soc():
    """The SoC of the recorded board tree (the device tree's rockchip,rkXXXX), as the NPU would tell it."""
    root = os.environ.get("RKSTUDY_SYSROOT", "/")
    try:
        with open(os.path.join(root, "proc/device-tree/compatible"), "rb") as fh:
            entries = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    chips = [e.split(",", 1)[1] for e in entries if e.startswith("rockchip,rk") and e.count(",") == 1]
    plain = [c for c in chips if c[2:].isdigit() or c == "rk3588s"]
    return plain[0].replace("rk3588s", "rk3588") if plain else None


def _c_log(level, message):
    """A line librknnrt itself writes: "E RKNN: [hh:mm:ss.mmm] <message>"."""
    stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
    sys.stderr.write(f"{level} RKNN: [{stamp}] {message}\n")
    sys.stderr.flush()


def _release(text):
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(g) for g in m.groups()) if m else None


def _librknnrt():
    """The version string of the librknnrt at $LIBRKNNRT_PATH or /usr/lib/librknnrt.so (in the recorded
    tree), where the runtime looks ("unknown" without one), or None when there is no file there."""
    root = os.environ.get("RKSTUDY_SYSROOT", "/")
    given = os.environ.get("LIBRKNNRT_PATH")
    try:
        with open(os.path.join(root, (given or "/usr/lib/librknnrt.so").lstrip("/")), "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    m = re.search(rb"librknnrt version: ([^\x00\n]+)", data)
    return m.group(1).decode(errors="replace").strip() if m else "unknown"


def _driver():
    """The rknpu driver's version as the tree's debugfs or module file says it, or None."""
    root = os.environ.get("RKSTUDY_SYSROOT", "/")
    for path in ("sys/kernel/debug/rknpu/version", "sys/module/rknpu/version"):
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                m = re.search(r"(\d+\.\d+\.\d+)", fh.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    return None


def _faulted(outputs):
    """The outputs as RKNNLITE_REPLAY_FAULT corrupts them (see the module docstring), or as they are."""
    fault = os.environ.get("RKNNLITE_REPLAY_FAULT")
    _inferences[0] += 1
    at = os.environ.get("RKNNLITE_REPLAY_FAULT_AT")
    if not fault or (at and int(at) != _inferences[0]):
        return outputs
    if fault not in FAULTS:
        raise ValueError(f"RKNNLITE_REPLAY_FAULT={fault!r}: one of {', '.join(FAULTS)}")
    if fault == "segfault":
        import signal

        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "submit-fails":
        _c_log("E", C_SUBMIT_FAILED)
        try:
            raise Exception(RUN_FAILED.format(ERROR_NAMES[-1]))
        except Exception:
            _log("E", "Catch exception when running RKNN model.")
            _log("E", traceback.format_exc())
        return None
    out = []
    for o in outputs:
        o = np.array(o, np.float32)
        if fault == "zeros":
            o[...] = 0.0
        elif fault == "overflow":
            axis = int(np.argmax(o.shape))
            n = o.shape[axis]
            start = int(os.environ.get("RKNNLITE_REPLAY_FIELD") or 8192)
            start = start if n > start else n // 2
            moved = np.moveaxis(o, axis, -1)
            moved[..., start:] = moved[..., : n - start].copy()
        else:  # nan-tail
            rows = o.reshape(-1, o.shape[-1]) if o.ndim > 1 and o.shape[-2] > 1 else o.reshape(1, -1)
            if rows.shape[0] > 1:
                tail = rows[-max(1, rows.shape[0] // 16):]
            else:
                tail = rows[:, -max(1, rows.shape[1] // 16):]
            pattern = np.resize(np.array([np.nan, FP16_MAX, -FP16_MAX], np.float32), tail.size)
            tail[...] = pattern.reshape(tail.shape)
        out.append(o)
    return out


class _ReplayRuntime:
    """What RKNNRuntime stands for: the engine's ONNX served by onnxruntime."""

    def __init__(self, onnx_bytes, soc, toolkit=None):
        runtime = _librknnrt()
        if runtime is None:
            for line in ("*" * 50, MISSING_IN_CONTAINER.format("/usr/lib/librknnrt.so"), "!!! Please put it into "
                         "/usr/lib/ directory.", "*" * 50):
                _log("W", line)
            raise Exception(NO_LIBRARY.format((soc or "unknown").upper()) + "\n" + DOWNLOAD_LIBRARY)
        time.sleep(float(os.environ.get("RKNNLITE_REPLAY_INIT_SECONDS") or 0))
        _c_log("I", C_RUNTIME_INFO.format(runtime))
        _c_log("I", C_DRIVER_INFO.format(_driver() or "unknown"))
        built, rt = _release(toolkit), _release(runtime)
        if built and rt and rt < MODEL_V6_TOOLKIT <= built:  # the engine format these runtimes refused at init
            modern = rt >= (1, 5, 0)
            _c_log("E", f"{MODEL_VERSION}, {4 if modern else 1}")
            _c_log("E", C_MODEL_VERSION.format(MODEL_VERSION))
            _c_log("E", C_LOAD_FAILED)
            raise Exception(INIT_FAILED.format(ERROR_NAMES[-6 if modern else -1]))
        code = os.environ.get("RKNNLITE_REPLAY_INIT_CODE")
        if code:
            raise Exception(INIT_FAILED.format(ERROR_NAMES.get(int(code), code)))
        if onnx_bytes is None:
            raise Exception(INIT_FAILED.format(ERROR_NAMES[-6]))
        import onnxruntime as ort

        self.soc = soc
        self.session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])

    def set_core_mask(self, core_mask):
        if core_mask == RKNNLite.NPU_CORE_AUTO:
            return 0
        if self.soc not in MULTI_CORE:
            _log("E", CORE_MASK_ONLY.format("RK3576 / RK3588"))
            _log("E", SET_CORE_MASK_FAILED.format(ERROR_NAMES[-13]))
            return -13
        if self.soc == "rk3576" and core_mask == RKNNLite.NPU_CORE_0_1_2:
            _log("W", RK3576_TWO_CORES)
        return 0


class RKNNLite:
    IS_TEST_DOUBLE = True

    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xffff

    def __init__(self, verbose=False, verbose_file=None):
        self.verbose = verbose
        self.rknn_data = None
        self.rknn_runtime = None
        self._path = None
        self._shape_sets = []
        self._toolkit = None

    def load_rknn(self, path, key_path=None):
        """success: 0, failure: -1 (a missing or unreadable file; the engine is checked at init_runtime)."""
        if not os.path.exists(path):
            _log("E", "Invalid RKNN model path: {}".format("None" if not path else path))
            return -1
        with open(path, "rb") as fh:
            self.rknn_data = fh.read()
        self._path = path
        return 0

    def _onnx(self):
        """The ONNX the engine was compiled from, through its contract, or None (not an engine it can serve);
        a multi-shape engine's shape sets are kept from the same contract."""
        try:
            with open(os.path.splitext(self._path)[0] + ".contract.json", encoding="utf-8") as fh:
                contract = json.load(fh)
            onnx_digest = contract["onnx"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self._shape_sets = [[tuple(x) for x in one] for one in contract.get("shapes") or []]
        self._toolkit = contract.get("toolkit")
        folders = [os.environ["RKNNLITE_REPLAY_ONNX_DIR"]] if os.environ.get("RKNNLITE_REPLAY_ONNX_DIR") else []
        for folder in folders + [os.path.dirname(os.path.abspath(self._path))]:
            candidate = os.path.join(folder, onnx_digest["file"])
            if os.path.isfile(candidate):
                with open(candidate, "rb") as fh:
                    data = fh.read()
                if hashlib.sha256(data).hexdigest() == onnx_digest["sha256"]:
                    return data
        return None

    def init_runtime(self, target=None, device_id=None, async_mode=False, core_mask=NPU_CORE_AUTO):
        """0, -1 for any exception (logged with its traceback), or set_core_mask's code."""
        if self.rknn_data is None:
            _log("E", "Model is not loaded yet, this interface should be called after load_rknn!")
            return -1
        if self.rknn_runtime is not None:
            self.release()
        try:
            onnx_bytes = self._onnx()
            self.rknn_runtime = _ReplayRuntime(onnx_bytes, _board_soc(), self._toolkit)
        except Exception:
            _log("E", "Catch exception when init runtime!")
            _log("E", traceback.format_exc())
            return -1
        try:
            ret = self.rknn_runtime.set_core_mask(core_mask)
        except Exception:
            _log("E", "Catch exception when set npu core mode.")
            return -1
        return ret

    def inference(self, inputs, data_type=None, data_format=None, inputs_pass_through=None, get_frame_id=False,
                  reuse_outputs=False):
        """Output data (list of ndarray), or None on failure, as the real one."""
        if self.rknn_runtime is None:
            _log("E", "Runtime environment is not inited, please call init_runtime to init it first!")
            return None
        session = self.rknn_runtime.session
        try:
            for i, x in enumerate(inputs):
                if np.asarray(x).dtype.name not in INPUT_DTYPES:
                    raise Exception(UNSUPPORTED_DTYPE.format(i, np.asarray(x).dtype))
            if self._shape_sets and [tuple(np.shape(x)) for x in inputs] not in self._shape_sets:
                raise Exception(SET_INPUT_SHAPE_FAILED.format(ERROR_NAMES[-8]))
            feed = {i.name: np.asarray(x) for i, x in zip(session.get_inputs(), inputs)}
        except Exception:
            _log("E", "Catch exception when setting inputs.")
            _log("E", traceback.format_exc())
            return None
        try:
            outputs = [np.asarray(o, np.float32) for o in session.run(None, feed)]
        except Exception:
            _log("E", "Catch exception when running RKNN model.")
            _log("E", traceback.format_exc())
            return None
        return _faulted(outputs)

    def get_sdk_version(self):
        if self.rknn_runtime is None:
            _log("E", "Runtime environment is not inited, please call init_runtime to init it first!")
            return None
        import onnxruntime as ort

        return f"API: replay double (onnxruntime {ort.__version__})\nDRV: none"

    def list_devices(self):
        """No adb or ntb devices: the double runs where the runtime would, on the board itself."""
        _log("I", "*" * 25)
        _log("I", "None devices connected.")
        _log("I", "*" * 25)
        return [], []

    def list_support_target_platform(self, rknn_model=None):
        return {"support_target_platform": ["rk3562", "rk3566", "rk3568", "rk3576", "rk3588"]}

    def release(self):
        self.rknn_runtime = None
