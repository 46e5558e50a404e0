"""The proving set's vocoders from their own PyPI packages, as their authors wrote them: `vocos` 0.1.0
(VocosBackbone and the ISTFTHead's projection), `bigvgan` 2.4.1 (BigVGAN with its anti-aliased
Snake-Beta activations), and two codecs' decoders: `descript-audio-codec` 1.0.0 (module `dac`: odd-stride
ConvTranspose upsamplers without output_padding, so its audio is a fixed few samples short of rate x
frames) and `snac` 1.2.1 (a NoiseBlock that draws noise on every call, windowed local attention after the
first conv), at small configs with seeded random weights, exported the ways their exporter can (host: torch).

Why load by file: both packages are architecture code without weights, installed with --no-deps
(`make models`, [tool.rkstudy] models-no-deps), and their package `__init__`s import what the
architectures do not need: `vocos/__init__` pulls the pretrained loader (encodec, torchaudio,
huggingface_hub's download), `vocos.heads` imports torchaudio for its mel-scale IMDCT head only, and
`bigvgan/__init__` and `bigvgan.utils` import the mel dataset (librosa). So the package is entered as a
bare package (its folder on the import path, its `__init__` not run) while its submodules load, and the
two files that import an absent library for code this project does not call are executed without that
one import line (a call that needed it would fail with a NameError, never silently). `dac`'s `__init__`,
`dac.model` and `dac.nn` import `audiotools` (descript-audiotools: audio I/O, loudness, a training
framework, with a long tail of binary dependencies) for the codec's file format, its losses and its
BaseModel; the decoder classes use none of it, so only `dac.nn.layers` and the decoder's own classes of
`dac.model.dac` are loaded (their definitions executed from the file, the DAC wrapper class left out).
`dac.nn.layers` and `snac.attention` import `einops` (pure python, used by snac's attention at run time),
installed --no-deps beside them. Nothing is fetched from a model hub: the weights are drawn from a seeded
generator.

The ISTFTHead's inverse STFT is complex-valued (no ONNX export): the graph ends at its real and imaginary
spectrum, the head's own lines up to `S = mag * (x + 1j * y)`, and `istft` turns them into audio on the
CPU with the head's own ISTFT module (`VocosModel.istft`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import os
import sys
import tempfile
import types
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from ...process import known_warnings

MELS = 80
INPUT = "mel"
OPSET_LEGACY = 17
OPSET_DYNAMO = 18   # rknn-toolkit2 2.5.0 loads opset 18 (notebook 04: a dynamo export at opset 20 is refused)
EXPORTERS = ("legacy", "dynamo")


class PackageMissing(ImportError):
    """A proving-set package is not installed (its fix: `make models`)."""


class ExportFailed(RuntimeError):
    """An exporter refused a module: its first line, which is what it says."""


@contextmanager
def _output_captured():
    """The process's fds 1 and 2 sent to a temporary file while the block runs.

    Why: the legacy exporter dumps the whole TorchScript graph (300 kB for the small BigVGAN) to the
    process's stdout when it fails; in a notebook kernel nobody drains that pipe while the cell runs, and
    the dump blocks the kernel for good once the pipe is full."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile(mode="w+") as tmp:
        for fd in saved:
            os.dup2(tmp.fileno(), fd)
        try:
            yield tmp
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in saved.items():
                os.dup2(old, fd)
                os.close(old)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissing(f"the {name!r} package is not installed; `make models` installs it (--no-deps)")
    return Path(list(spec.submodule_search_locations)[0])


@contextmanager
def _bare(packages: dict[str, Path]):
    """Each of `packages` (name -> folder) importable as a package whose __init__ is not run, for as long
    as the block runs."""
    saved = {name: sys.modules.get(name) for name in packages}
    for name, folder in packages.items():
        bare = types.ModuleType(name)
        bare.__path__, bare.__package__ = [str(folder)], name
        sys.modules[name] = bare
    try:
        yield
    finally:   # the bare modules out, what was there before back
        for name in packages:
            sys.modules.pop(name, None)
        sys.modules.update({name: old for name, old in saved.items() if old is not None})


@contextmanager
def _bare_package(name: str):
    """`name` importable as a package whose __init__ is not run, for as long as its submodules load."""
    folder = _package_dir(name)
    with _bare({name: folder}):
        yield folder


def _load_without(package: str, module: str, folder: Path, absent: tuple[str, ...]) -> types.ModuleType:
    """`package.module` executed from its file with the import statements of the `absent` modules left out."""
    full = f"{package}.{module}"
    if full in sys.modules:
        return sys.modules[full]
    path = folder / f"{module}.py"
    tree = ast.parse(path.read_text(), str(path))
    tree.body = [s for s in tree.body if not (isinstance(s, ast.ImportFrom) and (s.module or "") in absent)
                 and not (isinstance(s, ast.Import) and any(a.name in absent for a in s.names))]
    mod = types.ModuleType(full)
    mod.__file__, mod.__package__ = str(path), package
    sys.modules[full] = mod
    exec(compile(tree, str(path), "exec"), mod.__dict__)
    return mod


def _load_definitions(full: str, path: Path, names: tuple[str, ...], absent: tuple[str, ...]) -> types.ModuleType:
    """Module `full` holding only the imports of its file that name no `absent` module and the top-level
    definitions `names` (a class that subclasses an absent one, a `__main__` block: left out)."""
    if full in sys.modules:
        return sys.modules[full]
    tree = ast.parse(path.read_text(), str(path))

    def kept(s) -> bool:
        if isinstance(s, ast.ImportFrom):
            return not any((s.module or "").startswith(a) for a in absent) and s.level == 0
        if isinstance(s, ast.Import):
            return not any(a.name.startswith(x) for a in s.names for x in absent)
        return isinstance(s, (ast.ClassDef, ast.FunctionDef)) and s.name in names

    tree.body = [s for s in tree.body if kept(s)]
    mod = types.ModuleType(full)
    mod.__file__, mod.__package__ = str(path), full.rpartition(".")[0]
    sys.modules[full] = mod
    exec(compile(tree, str(path), "exec"), mod.__dict__)
    return mod


def dac_modules() -> types.ModuleType:
    """The decoder classes of `dac.model.dac` (Decoder, DecoderBlock, ResidualUnit) over `dac.nn.layers`
    (WNConv1d, WNConvTranspose1d, Snake1d), from the installed package without audiotools (see the
    module)."""
    folder = _package_dir("dac")
    with _bare({"dac": folder, "dac.nn": folder / "nn", "dac.model": folder / "model"}):
        importlib.import_module("dac.nn.layers")
        return _load_definitions("dac.model.dac", folder / "model" / "dac.py",
                                 ("ResidualUnit", "DecoderBlock", "Decoder"), ("audiotools", "dac.nn.quantize"))


def snac_layers() -> types.ModuleType:
    """`snac.layers` from the installed package (its Decoder, NoiseBlock and LocalMHA)."""
    _package_dir("snac")
    return importlib.import_module("snac.layers")


def vocos_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """`vocos.models` and `vocos.heads` from the installed package (torchaudio's mel helpers left out)."""
    with _bare_package("vocos") as folder:
        models = importlib.import_module("vocos.models")
        heads = _load_without("vocos", "heads", folder, ("torchaudio.functional.functional",))
    return models, heads


def bigvgan_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """`bigvgan.bigvgan` and `bigvgan.env` from the installed package (the mel dataset left out of utils)."""
    with _bare_package("bigvgan") as folder:
        _load_without("bigvgan", "utils", folder, ("meldataset",))
        module = importlib.import_module("bigvgan.bigvgan")
        env = importlib.import_module("bigvgan.env")
    return module, env


def seeded(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The module with every parameter drawn again from a seeded generator, scaled as its own init scales
    it: the package's random init runs on the global generator, so this makes the weights the same in
    every process. Snake's log-scale alpha and beta are drawn around 0 (frequency and magnitude around 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = float(p.detach().std()) if p.numel() > 1 and float(p.detach().std()) > 0 else 0.1
            if name.endswith(("alpha", "beta")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * scale + (p.detach().mean() if p.ndim > 1 else 0.0))
    return module.eval()


class VocosGraph(torch.nn.Module):
    """VocosBackbone -> ISTFTHead up to its complex spectrum (the head's own forward, before `istft`):
    outputs the spectrum's real and imaginary parts [1, n_fft / 2 + 1, frames]."""

    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, mel):
        x = self.head.out(self.backbone(mel)).transpose(1, 2)
        mag, p = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        return mag * torch.cos(p), mag * torch.sin(p)


@dataclass(frozen=True)
class Vocoder:
    """An exported vocoder and what a walker needs to know about it."""

    name: str
    model: onnx.ModelProto
    hop: int                    # output samples per mel frame (1 for a spectrum-frame output)
    outputs: tuple[str, ...]
    exporter: str               # legacy (TorchScript) or dynamo (torch.export)
    source: str                 # where the architecture's code comes from
    module: torch.nn.Module | None = None


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def exported(module: torch.nn.Module, outputs: tuple[str, ...], exporter: str, key: dict, **how) -> onnx.ModelProto:
    """`module` exported by `exporter` (`how`: the traced frames, the input's channels and name), from the
    build cache when the same package, config, seed, torch and this file made it before (a dynamo export of
    the small BigVGAN takes about a minute)."""
    from ... import cache

    parts = (Path(__file__), torch.__version__, onnx.__version__, exporter, key, how)
    path = cache.cached_file("exports", f"port_{key['name']}_{exporter}", cache.digest(*parts), ".onnx",
                             lambda tmp: onnx.save(_export(module, outputs, exporter, **how), str(tmp)))
    return onnx.load(str(path))


def _export(module: torch.nn.Module, outputs: tuple[str, ...], exporter: str, frames: int = 48,
            channels: int = MELS, name: str = INPUT) -> onnx.ModelProto:
    x = torch.zeros(1, channels, frames)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            buf = io.BytesIO()
            try:
                with _output_captured():
                    torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=OPSET_LEGACY,
                                      input_names=[name], output_names=list(outputs),
                                      dynamic_axes={name: {2: "frames"}, **{o: {2: "samples"} for o in outputs}})
            except Exception as exc:   # its first line is what it says; the rest is the graph it gave up on
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ExportFailed(f"the legacy exporter refused it: {first[:300]}") from None
            return onnx.load_from_string(buf.getvalue())
        if exporter != "dynamo":
            raise ValueError(f"exporter {exporter!r}: one of {', '.join(EXPORTERS)}")
        with known_warnings("torchvision"):
            program = torch.onnx.export(module, (x,), dynamo=True, opset_version=OPSET_DYNAMO, input_names=[name],
                                        output_names=list(outputs), verbose=False,
                                        dynamic_shapes=({2: torch.export.Dim("frames", min=8, max=8192)},))
        return program.model_proto


def vocos(exporter: str = "legacy", seed: int = 0, dim: int = 64, layers: int = 3, n_fft: int = 64,
          hop: int = 16) -> Vocoder:
    """The real `vocos` VocosBackbone (ConvNeXt blocks: depthwise conv, Transpose, LayerNorm, Linear, GELU,
    layer scale) and ISTFTHead projection at a small config, seeded; outputs `real`, `imag`
    [1, n_fft / 2 + 1, frames] at one spectrum frame per mel frame (the iSTFT's hop is `hop` samples)."""
    models, heads = vocos_modules()
    torch.manual_seed(seed)
    with known_warnings("weight-norm"):
        net = seeded(VocosGraph(models.VocosBackbone(MELS, dim, 3 * dim, layers), heads.ISTFTHead(dim, n_fft, hop)),
                     seed)
    key = {"name": "vocos", "package": _version("vocos"), "seed": seed, "dim": dim, "layers": layers, "n_fft": n_fft,
           "hop": hop}
    return Vocoder("vocos", exported(net, ("real", "imag"), exporter, key), 1, ("real", "imag"), exporter,
                   f"vocos {key['package']}: vocos.models.VocosBackbone + vocos.heads.ISTFTHead", net)


def istft(vocoder: Vocoder, real: np.ndarray, imag: np.ndarray) -> np.ndarray:
    """Audio from the spectrum a Vocos graph makes, through the head's own ISTFT module (CPU, torch)."""
    spec = torch.complex(torch.as_tensor(real, dtype=torch.float32), torch.as_tensor(imag, dtype=torch.float32))
    with torch.no_grad():
        return vocoder.module.head.istft(spec.reshape(1, *spec.shape[-2:])).numpy()[0]


def bigvgan_config(channels: int = 32, rates=(4, 2)) -> dict:
    """A small BigVGAN-v2-style config: Snake-Beta (log scale) in anti-aliased activations, AMP block 1,
    no tanh and no bias at the end, two upsamplers."""
    return dict(num_mels=MELS, upsample_rates=list(rates), upsample_kernel_sizes=[2 * r for r in rates],
                upsample_initial_channel=channels, resblock="1", resblock_kernel_sizes=[3, 7],
                resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], activation="snakebeta", snake_logscale=True,
                use_tanh_at_final=False, use_bias_at_final=False)


def bigvgan(exporter: str = "dynamo", seed: int = 0, channels: int = 32, rates=(4, 2)) -> Vocoder:
    """The real `bigvgan` BigVGAN generator at a small config (its AMP blocks: anti-aliased Snake-Beta
    activations that pad in replicate mode, upsample with a grouped ConvTranspose and downsample with a
    strided low-pass Conv), seeded; output `audio` [1, 1, hop x frames]. The legacy exporter cannot
    export it (its filters are `expand`ed at run time: "convolution for kernel of unknown shape"), so
    `exporter="legacy"` raises what the exporter says."""
    module, env = bigvgan_modules()
    torch.manual_seed(seed)
    with known_warnings("weight-norm"):
        net = seeded(module.BigVGAN(env.AttrDict(bigvgan_config(channels, rates))), seed)
    key = {"name": "bigvgan", "package": _version("bigvgan"), "seed": seed, "config": bigvgan_config(channels, rates)}
    return Vocoder("bigvgan", exported(net, ("audio",), exporter, key), int(np.prod(rates)), ("audio",), exporter,
                   f"bigvgan {key['package']}: bigvgan.bigvgan.BigVGAN", net)


LATENT = "z"
DAC_24K_RATES = (8, 5, 4, 2)   # the 24 kHz model's decoder: hop 320, odd stride 5 without output_padding
DAC_44K_RATES = (8, 8, 4, 2)   # the 44.1 kHz model's: hop 512
SNAC_RATES = (8, 8, 4, 2)      # the 24/32 kHz models' decoder: hop 512
SNAC_WINDOW = 32               # LocalMHA's attention window (frames) in the 32 and 44 kHz models


def dac(rates=DAC_24K_RATES, exporter: str = "legacy", seed: int = 0, latent: int = 16, channels: int = 64,
        frames: int = 48) -> Vocoder:
    """The real `dac` decoder (descript-audio-codec: a k=7 conv, then per rate a Snake1d, a weight-normed
    ConvTranspose of kernel 2s, stride s, padding ceil(s / 2) and no output_padding, three dilated residual
    units; Snake1d, a k=7 conv and tanh) at `channels` (halved per upsampler), seeded; input `z`
    [1, latent, frames], output `audio` [1, 1, hop x frames - r], where an odd stride s leaves r > 0 (the
    package's own decode is that long: 24 kHz layout, r = 8)."""
    module = dac_modules()
    torch.manual_seed(seed)
    with known_warnings("weight-norm"):
        net = seeded(module.Decoder(latent, channels, list(rates)), seed)
    key = {"name": f"dac_{'_'.join(map(str, rates))}", "package": _version("descript-audio-codec"), "seed": seed,
           "latent": latent, "channels": channels}
    return Vocoder(key["name"], exported(net, ("audio",), exporter, key, frames=frames, channels=latent, name=LATENT),
                   int(np.prod(rates)), ("audio",), exporter,
                   f"descript-audio-codec {key['package']}: dac.model.dac.Decoder", net)


def snac(exporter: str = "legacy", seed: int = 0, latent: int = 16, channels: int = 64, rates=SNAC_RATES,
         window: int | None = SNAC_WINDOW, noise: bool = True, frames: int = 2 * SNAC_WINDOW) -> Vocoder:
    """The real `snac` decoder (depthwise k=7 conv and a 1x1 conv; LocalMHA over windows of `window`
    frames; per rate a Snake1d, a ConvTranspose (output_padding s % 2), a NoiseBlock that multiplies
    fresh Gaussian noise into the signal on every call, three residual units; Snake1d, a k=7 conv, tanh)
    at `channels`, seeded; input `z` [1, latent, frames] (a multiple of `window`), output `audio`."""
    layers = snac_layers()
    torch.manual_seed(seed)
    with known_warnings("weight-norm"):
        net = seeded(layers.Decoder(latent, channels, list(rates), noise, depthwise=True, attn_window_size=window),
                     seed)
    key = {"name": f"snac{'_noise' if noise else ''}{f'_w{window}' if window else ''}",
           "package": _version("snac"), "seed": seed, "latent": latent, "channels": channels, "rates": list(rates)}
    return Vocoder(key["name"], exported(net, ("audio",), exporter, key, frames=frames, channels=latent, name=LATENT),
                   int(np.prod(rates)), ("audio",), exporter, f"snac {key['package']}: snac.layers.Decoder", net)
