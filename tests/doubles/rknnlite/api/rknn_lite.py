"""A test double of rknn-toolkit-lite2 2.5.0's RKNNLite: same constants, methods and return codes.

`load_rknn` reads the engine and finds, through its stage contract (`<engine>.contract.json`), the ONNX it
was compiled from (beside the engine, or in $RKNNLITE_REPLAY_ONNX_DIR), checking its sha256; `init_runtime`
serves that ONNX with onnxruntime. `RKNNLITE_REPLAY_CORES=1` makes it a single-core NPU that refuses any
core mask but AUTO, as an RK3566 does. `RKNNLITE_REPLAY_INIT_CODE=-4` makes the runtime refuse every
init the way 2.5.0 reports it: init_runtime returns -1 and the librknnrt code is only in the log it
writes to fd 2 ("RKNN init failed. error code: -4", the format string in 2.5.0's rknn_runtime
extension). `IS_TEST_DOUBLE` tells rkstudy's BoardRunner to label its rows `replay`. Used only by tests.
"""

import hashlib
import json
import os

import numpy as np


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
        self._onnx = None

    def load_rknn(self, path, key_path=None):
        """success: 0, failure: -1 (as the real one: a missing file or no readable contract/ONNX)."""
        if not os.path.exists(path):
            return -1
        with open(path, "rb") as fh:
            self.rknn_data = fh.read()
        contract_path = os.path.splitext(path)[0] + ".contract.json"
        try:
            with open(contract_path, encoding="utf-8") as fh:
                onnx_digest = json.load(fh)["onnx"]
        except (OSError, ValueError, KeyError, TypeError):
            return -1
        folders = [os.path.dirname(os.path.abspath(path))]
        if os.environ.get("RKNNLITE_REPLAY_ONNX_DIR"):
            folders.insert(0, os.environ["RKNNLITE_REPLAY_ONNX_DIR"])
        for folder in folders:
            candidate = os.path.join(folder, onnx_digest["file"])
            if os.path.isfile(candidate):
                with open(candidate, "rb") as fh:
                    data = fh.read()
                if hashlib.sha256(data).hexdigest() == onnx_digest["sha256"]:
                    self._onnx = data
                    return 0
        return -1

    def init_runtime(self, target=None, device_id=None, async_mode=False, core_mask=NPU_CORE_AUTO):
        """success: 0, failure: -1."""
        if self.rknn_data is None or self._onnx is None:
            return -1
        known = (self.NPU_CORE_AUTO, self.NPU_CORE_0, self.NPU_CORE_1, self.NPU_CORE_2, self.NPU_CORE_0_1,
                 self.NPU_CORE_0_1_2, self.NPU_CORE_ALL)
        if core_mask not in known:
            return -1
        if os.environ.get("RKNNLITE_REPLAY_CORES") == "1" and core_mask not in (self.NPU_CORE_AUTO, self.NPU_CORE_0):
            return -1
        if os.environ.get("RKNNLITE_REPLAY_INIT_CODE"):
            code = int(os.environ["RKNNLITE_REPLAY_INIT_CODE"])
            os.write(2, f"E RKNN init failed. error code: {code}\n".encode())
            os.write(2, b"E Catch exception when init runtime!\n")
            return -1
        import onnxruntime as ort

        self.rknn_runtime = ort.InferenceSession(self._onnx, providers=["CPUExecutionProvider"])
        return 0

    def inference(self, inputs, data_type=None, data_format=None, inputs_pass_through=None, get_frame_id=False,
                  reuse_outputs=False):
        """Output data (list of ndarray), or None on failure, as the real one."""
        if self.rknn_runtime is None:
            return None
        dtypes = {"tensor(float)": np.float32, "tensor(int64)": np.int64}
        try:
            feed = {i.name: np.asarray(x).astype(dtypes.get(i.type, np.float32))
                    for i, x in zip(self.rknn_runtime.get_inputs(), inputs)}
            return [np.asarray(o, np.float32) for o in self.rknn_runtime.run(None, feed)]
        except Exception:  # the real runtime logs and returns None
            return None

    def get_sdk_version(self):
        if self.rknn_runtime is None:
            return None
        import onnxruntime as ort

        return f"API: replay double (onnxruntime {ort.__version__})\nDRV: none"

    def list_support_target_platform(self, rknn_model=None):
        return {"support_target_platform": ["rk3588", "rk3566"]}

    def release(self):
        self.rknn_runtime = None
