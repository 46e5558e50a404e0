"""Small vocoders written here after published generators, built from torch modules with seeded weights.

Why: the stateful-step surgery and its boundary pass (rkstudy.graph.validity) claim to be exact for any
graph the streaming rules accept. The proving set's main witnesses are the real `vocos` and `bigvgan`
modules from their own packages (rkstudy.families.port.packages); these builders add the shapes those do
not cover, at a size that runs in seconds: a HiFi-GAN V1/V3 generator (transposed-conv upsamplers,
multi-receptive-field resblocks, LeakyReLU, tanh), a MelGAN generator (weight norm, reflection pads
before its convs as MelGAN writes them, dilated residual stacks with 1x1 shortcuts), a Snake generator
with odd strides (x5, x4, x3 upsamplers with output_padding, as codec decoders write them), and an
instance-norm one that cannot stream. None of them masks anything: their boundary behaviour is the
convs' own zero padding and the reflection pads, as an exported vocoder's is.

Every builder returns an exported ONNX model (torch.onnx.export, TorchScript exporter, opset 17)
with input `mel` [1, mels, frames] whose frame axis is dynamic; pin and fold it (rkstudy.graph.fold)
before rkstudy.graph.stateful.make_step. Host only (torch).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import onnx
import torch
from torch import nn

from ...process import known_warnings

MELS = 80
INPUT = "mel"
SPEAKER = "g"   # a speaker embedding [1, dims, 1], constant over the utterance
OPSET = 17


@dataclass(frozen=True)
class Vocoder:
    """An exported vocoder and what a walker needs to know about it."""

    name: str
    model: onnx.ModelProto
    hop: int                    # output samples per mel frame (1 for a spectrum-frame output)
    outputs: tuple[str, ...]
    exporter: str = "legacy"    # torch.onnx.export's TorchScript exporter
    source: str = "rkstudy.families.port.architectures (written here after the published generator)"


def _seeded(module: nn.Module, seed: int, scale: float) -> nn.Module:
    """Every parameter drawn from N(0, scale^2 / fan_in) (biases from N(0, scale^2 / 4)), so the
    activations keep a useful range through the stack whatever its depth."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("alpha"):       # Snake frequencies: positive, around 1
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * scale / 2)
            else:
                fan_in = p[0].numel() if not isinstance(_owner(module, name), nn.ConvTranspose1d) else \
                    p.shape[0] * p.shape[2] // _owner(module, name).stride[0]
                p.copy_(torch.randn(p.shape, generator=gen) * scale / fan_in ** 0.5)
    return module.eval()


def _owner(module: nn.Module, name: str) -> nn.Module:
    return module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module


def _export(module: nn.Module, frames: int, outputs: tuple[str, ...], speaker_dims: int = 0) -> onnx.ModelProto:
    buf = io.BytesIO()
    args = (torch.zeros(1, MELS, frames),) + ((torch.zeros(1, speaker_dims, 1),) if speaker_dims else ())
    with torch.no_grad(), known_warnings("slice-folding", "instance-norm-train"):
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=OPSET,
                          input_names=[INPUT] + ([SPEAKER] if speaker_dims else []), output_names=list(outputs),
                          dynamic_axes={INPUT: {2: "frames"}, **{o: {2: "samples"} for o in outputs}})
    return onnx.load_from_string(buf.getvalue())


def _pad(kernel: int, dilation: int = 1) -> int:
    return (kernel - 1) * dilation // 2


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, one alpha per channel (BigVGAN's activation)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        return x + torch.sin(self.alpha * x) ** 2 / (self.alpha + 1e-9)


class ResBlock1(nn.Module):
    """HiFi-GAN V1's resblock: per dilation, act -> dilated conv -> act -> conv, plus the input."""

    def __init__(self, ch: int, kernel: int, dilations, act):
        super().__init__()
        self.c1 = nn.ModuleList(nn.Conv1d(ch, ch, kernel, dilation=d, padding=_pad(kernel, d)) for d in dilations)
        self.c2 = nn.ModuleList(nn.Conv1d(ch, ch, kernel, padding=_pad(kernel)) for _ in dilations)
        self.a1 = nn.ModuleList(act(ch) for _ in dilations)
        self.a2 = nn.ModuleList(act(ch) for _ in dilations)

    def forward(self, x):
        for c1, c2, a1, a2 in zip(self.c1, self.c2, self.a1, self.a2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class ResBlock2(nn.Module):
    """HiFi-GAN V3's resblock: per dilation, act -> dilated conv, plus the input."""

    def __init__(self, ch: int, kernel: int, dilations, act):
        super().__init__()
        self.c = nn.ModuleList(nn.Conv1d(ch, ch, kernel, dilation=d, padding=_pad(kernel, d)) for d in dilations)
        self.a = nn.ModuleList(act(ch) for _ in dilations)

    def forward(self, x):
        for c, a in zip(self.c, self.a):
            x = c(a(x)) + x
        return x


class _Leaky(nn.Module):
    def __init__(self, _channels: int, slope: float = 0.1):
        super().__init__()
        self.slope = slope

    def forward(self, x):
        return nn.functional.leaky_relu(x, self.slope)


class Generator(nn.Module):
    """conv_pre -> per stage (act, ConvTranspose upsampler, the mean of the MRF resblocks) -> act ->
    conv_post -> tanh (HiFi-GAN) or clamp to [-1, 1] (BigVGAN)."""

    def __init__(self, ch: int, rates, kernels, resblock, resblock_kernels, dilations, act, final: str,
                 speaker_dims: int = 0):
        super().__init__()
        self.conv_pre = nn.Conv1d(MELS, ch, 7, padding=3)
        self.cond = nn.Conv1d(speaker_dims, ch, 1) if speaker_dims else None
        self.ups, self.up_acts, self.blocks = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for k, (u, kernel) in enumerate(zip(rates, kernels)):
            c_in, c_out = ch // 2 ** k, ch // 2 ** (k + 1)
            self.up_acts.append(act(c_in))
            self.ups.append(nn.ConvTranspose1d(c_in, c_out, kernel, u, padding=(kernel - u) // 2))
            self.blocks.append(nn.ModuleList(resblock(c_out, kr, d, act) for kr, d in zip(resblock_kernels, dilations)))
        self.post_act = act(ch // 2 ** len(rates)) if final == "clamp" else _Leaky(0, 0.01)
        self.conv_post = nn.Conv1d(ch // 2 ** len(rates), 1, 7, padding=3)
        self.final = final

    def forward(self, mel, g=None):
        x = self.conv_pre(mel)
        if self.cond is not None:   # VITS's speaker conditioning: a per-utterance bias after conv_pre
            x = x + self.cond(g)
        for act, up, blocks in zip(self.up_acts, self.ups, self.blocks):
            x = up(act(x))
            x = sum(b(x) for b in blocks) / len(blocks)
        x = self.conv_post(self.post_act(x))
        return torch.tanh(x) if self.final == "tanh" else torch.clamp(x, -1.0, 1.0)


def hifigan(version: int = 1, seed: int = 0, channels: int = 64, frames: int = 64, speaker_dims: int = 0) -> Vocoder:
    """HiFi-GAN-like: V1 (ResBlock1, kernels 3/7/11, dilations 1/3/5) or V3 (ResBlock2, kernels 3/5/7,
    dilations 1/3), two upsamplers x4 (kernel 8), LeakyReLU 0.1, tanh: hop 16. With `speaker_dims`,
    a second input `g` [1, speaker_dims, 1] conditions it as VITS does (x + cond(g) after conv_pre)."""
    if version not in (1, 3):
        raise ValueError(f"HiFi-GAN version {version}: choose 1 or 3")
    block, kernels, dilations = ((ResBlock1, (3, 7, 11), ((1, 3, 5),) * 3) if version == 1
                                 else (ResBlock2, (3, 5, 7), ((1, 3),) * 3))
    gen = _seeded(Generator(channels, (4, 4), (8, 8), block, kernels, dilations, _Leaky, "tanh", speaker_dims),
                  seed, 1.0)
    return Vocoder(f"hifigan_v{version}", _export(gen, frames, ("audio",), speaker_dims), 16, ("audio",))


class MelGANResStack(nn.Module):
    """MelGAN's residual stack: per dilation 1/3/9, LeakyReLU -> reflection pad d -> dilated conv k3 ->
    LeakyReLU -> conv k1, plus a 1x1-conv shortcut of the input."""

    def __init__(self, ch: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(_Leaky(0, 0.2), nn.ReflectionPad1d(d),
                                                  nn.Conv1d(ch, ch, 3, dilation=d),
                                                  _Leaky(0, 0.2), nn.Conv1d(ch, ch, 1)) for d in (1, 3, 9))
        self.shortcuts = nn.ModuleList(nn.Conv1d(ch, ch, 1) for _ in (1, 3, 9))

    def forward(self, x):
        for block, shortcut in zip(self.blocks, self.shortcuts):
            x = shortcut(x) + block(x)
        return x


class MelGAN(nn.Module):
    """reflection pad 3 -> conv k7 -> per stage (LeakyReLU, ConvTranspose with kernel 2 x stride, residual
    stack) -> LeakyReLU -> reflection pad 3 -> conv k7 -> tanh; weight-normed, as MelGAN is."""

    def __init__(self, ch: int, rates):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        layers = [nn.ReflectionPad1d(3), wn(nn.Conv1d(MELS, ch, 7))]
        for k, u in enumerate(rates):
            c_in, c_out = ch // 2 ** k, ch // 2 ** (k + 1)
            layers += [_Leaky(0, 0.2), wn(nn.ConvTranspose1d(c_in, c_out, 2 * u, u, padding=u // 2)),
                       MelGANResStack(c_out)]
        layers += [_Leaky(0, 0.2), nn.ReflectionPad1d(3), wn(nn.Conv1d(ch // 2 ** len(rates), 1, 7)), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, mel):
        return self.net(mel)


def melgan(seed: int = 0, channels: int = 64, frames: int = 64) -> Vocoder:
    """MelGAN: upsamplers x4 and x4 (kernels 8), reflection pads, dilated residual stacks with 1x1
    shortcuts, weight norm (constant-folded by the export), tanh: hop 16."""
    net = _seeded(MelGAN(channels, (4, 4)), seed, 1.0)
    return Vocoder("melgan", _export(net, frames, ("audio",)), 16, ("audio",))


class OddStrideSnake(nn.Module):
    """conv k7 -> per stage (Snake, ConvTranspose kernel 2s, stride s, padding ceil(s / 2), output_padding
    s mod 2, a Snake resblock) -> Snake -> conv k7 -> tanh: the upsampler a codec decoder writes for odd
    strides (its output is exactly s x its input long only with the output_padding)."""

    def __init__(self, ch: int, rates):
        super().__init__()
        self.pre = nn.Conv1d(MELS, ch, 7, padding=3)
        self.stages = nn.ModuleList()
        for k, s in enumerate(rates):
            c_in, c_out = ch // 2 ** k, ch // 2 ** (k + 1)
            self.stages.append(nn.Sequential(
                Snake(c_in), nn.ConvTranspose1d(c_in, c_out, 2 * s, s, padding=(s + 1) // 2, output_padding=s % 2),
                ResBlock2(c_out, 3, (1, 3), Snake)))
        self.post = nn.Sequential(Snake(ch // 2 ** len(rates)), nn.Conv1d(ch // 2 ** len(rates), 1, 7, padding=3))

    def forward(self, mel):
        x = self.pre(mel)
        for stage in self.stages:
            x = stage(x)
        return torch.tanh(self.post(x))


def odd_strides(seed: int = 0, channels: int = 48, frames: int = 64, rates=(5, 4, 3)) -> Vocoder:
    """Snake generator with upsamplers x5 (output_padding 1), x4 and x3 (output_padding 1): hop 60."""
    net = _seeded(OddStrideSnake(channels, rates), seed, 1.0)
    hop = 1
    for r in rates:
        hop *= r
    return Vocoder("odd_strides", _export(net, frames, ("audio",)), hop, ("audio",))


class InstanceNormVocoder(nn.Module):
    """A conv, an instance norm over time, a conv: a global reduction over time, which no step can
    stream (every output frame depends on the whole utterance's statistics)."""

    def __init__(self, ch: int):
        super().__init__()
        self.pre, self.norm, self.post = nn.Conv1d(MELS, ch, 3, padding=1), nn.InstanceNorm1d(ch), \
            nn.Conv1d(ch, 1, 3, padding=1)

    def forward(self, mel):
        return self.post(self.norm(self.pre(mel)))


def instance_norm(seed: int = 0, channels: int = 32, frames: int = 64) -> Vocoder:
    net = _seeded(InstanceNormVocoder(channels), seed, 1.0)
    return Vocoder("instance_norm", _export(net, frames, ("audio",)), 1, ("audio",))


BUILDERS = {"hifigan_v1": lambda seed=0: hifigan(1, seed), "hifigan_v3": lambda seed=0: hifigan(3, seed),
            "melgan": melgan, "odd_strides": odd_strides}
