"""The Kokoro iSTFTNet generator trunk, re-traced for a fixed-window NPU engine.

The seam is the generator alone, without its source synthesis and iSTFT (those stay on the CPU):

  inputs   x     [1, 512, W]       latent at 80 frames/s
           har   [1, 22, 60W+1]    |STFT| and angle of the harmonic source
           style [1, 128]          decoder half of the voice vector
           m10   [1, 1, 10W]       frame mask at the first normalizing rate (after ups.0)
           m60   [1, 1, 60W+1]     frame mask at the fine rate (after ups.1 + reflect pad)
  output   gen   [1, 22, 60W+1]    conv_post output: rows 0..10 log-magnitude, 11..21 the
                                   phase argument; the CPU head takes exp / sin and the iSTFT

Keeping exp and sin of the head off the engine is deliberate: the board runtime has no NPU Sin
and the output is 22 rows, so it costs nothing on the CPU.

Rewrites (each switchable through `Rewrites`, each verified in fp32 against kokoro's own
Generator by the driver):

* weight norm folded at load: the recovered weights already are the effective kernels (see
  weights.py); `weight_norm=True` re-parametrizes them (g = ||v||, v = w) only to show what a
  traced weight norm does to the graph (ReduceL2 nodes that rknn.build aborts on).
* masked instance norm through GlobalAveragePool: statistics are GAP(x*m) / GAP(m) (count
  fractions: means, never raw sums, so no node of the statistics grows with the window; the reference documents'
  raw-sum form, GAP * L / (GAP(m) * L), is kept as `stats="sum"` to show what it does to the fp16
  range), and every AdaIN output is multiplied by its mask, so Snake and the following conv read
  exact zeros in the padding, as a full decode reads its implicit zero padding. The resblock sum is masked before the
  ConvTranspose / conv_post that read it. That is the complete set: everything else that
  carries padding garbage (conv outputs, residual sums) is only read by a masked statistic or
  a masked AdaIN output. har and x arrive zero-padded from the CPU.
* Snake's sine: "exact" (Sin, the reference), "poly" (range-reduced: k = floor(t/2pi + 1/2),
  r = t - 2pi k, odd minimax polynomial of `degree` on [-pi, pi]), or "clip" (t clipped to
  [-pi, pi], same polynomial) for comparison.
* split dilated convs: the dilated convs rknn-toolkit2 2.5.0 cannot encode (SPLIT_SHAPES: six
  of the 48 resblock convs) run as two narrower convs over the same input (taps [0, ceil(k/2))
  and the rest), summed; exact algebra, same MACs, one Add and two Slices more each.
* polyphase ups.0: the stride-10 ConvTranspose1d (the compiler's stride field is 3 bits: the
  rk3588 build logs "limit: 0x7, value: 0x9" for it) as a kernel-2 conv to 10 phases per
  channel, interleaved by Reshape/Transpose; exact algebra, same MACs (PolyphaseUp).
* alpha fold: Snake(y) = y + sin^2(a y)/a. The alpha multiply goes into the preceding AdaIN
  (its fc rows and its "1 +" become "a +"), the 1/alpha into the following conv's input
  channels: y' = a y, z' = y' + sin^2(y') = a * Snake(y), conv(W diag(1/a), z') = conv(W, Snake(y)).
* style projection as convs: each AdaIN's fc (Linear 128 -> 2C, then its two halves) is traced as two
  1x1 convs over style [1, 128, 1], the scale's "one +" in its bias. Exact algebra, same MACs; the
  toolkit lowers the Gemm to convs itself, but one rewrite at a time (Gemm to matmul and add, the
  channel split, the bias add into the conv), each about a second on this 80 MB graph, which was half
  of every rk3588 build (157 s against 81 s at W = 64).

Two variants that are not the engine's graph but measure why it is what it is:
* the statistics hook (`_Stats`): record every AdaIN's (mean, 1/std) of one run and replay them in
  later runs (frozen statistics: the convolutions' own reach; a full-length decode's statistics fed to
  every window: the "global statistics" cure), or take them from graph inputs (`FedStatsTrunk`, the
  engine form of that cure);
* `InGraphWalk` (--max-axis): the runtime's window walk moved inside the graph, so a wide window is
  several narrow ones and no axis is longer than the narrow window's fine axis.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...walk.window import plan_windows

EPS = 1e-5           # InstanceNorm1d's epsilon (the ONNX adds 1e-5 before Sqrt)
KERNELS = 3          # resblocks per stage
TWO_PI = 2.0 * math.pi
FINE = 60            # fine-rate columns per latent frame (ups 10 x 6)
COARSE = 10          # columns per latent frame after ups.0
SINES = ("exact", "poly", "clip")
DEGREES = (5, 7, 9)
STATS = ("mean", "sum")


@dataclass(frozen=True)
class Rewrites:
    """Which rewrites the trunk applies. The default is the engine's graph."""

    masked: bool = True
    sine: str = "poly"        # exact | poly | clip
    degree: int = 5           # 5, 7 or 9 (odd minimax polynomial)
    alpha_fold: bool = True
    split_dilated: bool = True
    polyphase: bool = True
    weight_norm: bool = False
    stats: str = "mean"       # mean: GAP count fractions; sum: the reference documents' raw sums over the axis

    def __post_init__(self):
        if self.sine not in SINES:
            raise ValueError(f"sine={self.sine!r}: use exact, poly or clip")
        if self.degree not in DEGREES:
            raise ValueError(f"degree={self.degree}: the fits are 5, 7 and 9")
        if self.stats not in STATS:
            raise ValueError(f"stats={self.stats!r}: use mean or sum")

    def tag(self) -> str:
        """Short file-name tag, e.g. 'mask_poly5_af'."""
        sine = "exact" if self.sine == "exact" else f"{self.sine}{self.degree}"
        return "_".join(["mask" if self.masked else "nomask", sine]
                        + (["af"] if self.alpha_fold else []) + ([] if self.split_dilated else ["nosplit"])
                        + ([] if self.polyphase else ["nopoly"])
                        + (["wn"] if self.weight_norm else []) + (["rawsum"] if self.stats == "sum" else []))


REFERENCE = Rewrites(masked=False, sine="exact", alpha_fold=False, split_dilated=False, polyphase=False)
ENGINE = Rewrites()  # the engine's graph: every rewrite, the degree-5 range-reduced sine


# --- the sine --------------------------------------------------------------------------------

@cache
def minimax_sine(degree: int, grid: int = 4001) -> tuple[float, ...]:
    """Odd-power coefficients (c1, c3, ...) minimizing max |p(r) - sin(r)| on [-pi, pi].

    Solved as a linear program on a dense grid of [0, pi] (odd symmetry covers the rest):
    minimize t subject to -t <= p(r_i) - sin(r_i) <= t.
    """
    from scipy.optimize import linprog

    r = np.linspace(0.0, math.pi, grid)
    powers = np.stack([r ** p for p in range(1, degree + 1, 2)], axis=1)
    n = powers.shape[1]
    target = np.sin(r)
    a_ub = np.block([[powers, -np.ones((grid, 1))], [-powers, -np.ones((grid, 1))]])
    b_ub = np.concatenate([target, -target])
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (n + 1), method="highs")
    if not res.success:
        raise RuntimeError(f"minimax fit of degree {degree} failed: {res.message}")
    return tuple(float(c) for c in res.x[:n])


def odd_poly(r: torch.Tensor, coeffs) -> torch.Tensor:
    """r * (c1 + r^2 (c3 + r^2 (c5 + ...))) in Horner form (Mul/Add only)."""
    r2 = r * r
    acc = r2 * coeffs[-1] + coeffs[-2]
    for c in reversed(coeffs[:-2]):
        acc = acc * r2 + c
    return acc * r


def range_reduce(t: torch.Tensor) -> torch.Tensor:
    """t - 2pi * floor(t / 2pi + 1/2), in [-pi, pi) (Mul, Add, Floor, Mul, Sub)."""
    k = torch.floor(t * (1.0 / TWO_PI) + 0.5)
    return t - k * TWO_PI


def sine(t: torch.Tensor, mode: str, degree: int = 5) -> torch.Tensor:
    """sin(t) in one of the three forms the engine can be built with."""
    if mode == "exact":
        return torch.sin(t)
    coeffs = minimax_sine(degree)
    if mode == "poly":
        return odd_poly(range_reduce(t), coeffs)
    if mode == "clip":
        return odd_poly(torch.clamp(t, -math.pi, math.pi), coeffs)
    raise ValueError(f"unknown sine mode {mode!r}")


# --- building blocks -------------------------------------------------------------------------

class _Stats:
    """Optional hook on every normalization: record (mean, 1/std), replay recorded ones, or take them
    from graph inputs, in call order (the order is fixed by the trunk, so item k is always one AdaIN).

    Record then replay measures the receptive field with the statistics frozen (a perturbation can
    only travel through the convolutions) and feeds a full-length decode's statistics to every window
    (the global-statistics variant); `feed` slices them from two graph inputs (FedStatsTrunk)."""

    def __init__(self):
        self.mode, self.items, self.i = None, [], 0
        self.fed = None

    def start(self) -> None:
        """Called at the top of every forward: a replay or a feed starts again at the first AdaIN."""
        self.i = 0

    def __call__(self, mu, rs):
        if self.mode == "record":
            self.items.append((mu.detach(), rs.detach()))
        elif self.mode == "replay":
            mu, rs = self.items[self.i]
            self.i += 1
        elif self.mode == "feed":
            c = mu.shape[1]
            mu, rs = self.fed[0][:, self.i: self.i + c], self.fed[1][:, self.i: self.i + c]
            self.i += c
        return mu, rs


class AdaIN(nn.Module):
    """(scale(s)) * norm(x) + beta(s), scale = one + gamma; `one` is 1, or alpha when folded."""

    def __init__(self, fc: nn.Linear, one: torch.Tensor, stats: _Stats, raw_sums: bool = False):
        super().__init__()
        self.fc = fc
        self.register_buffer("one", one.reshape(1, -1, 1).clone())
        self.stats = stats
        self.raw_sums = raw_sums  # then `inv` is 1 / (frame count), not 1 / (count fraction)

    def projection(self, s):
        """(one + gamma(s), beta(s)), [1, C, 1] each, as two 1x1 convs over s: constants the exporter
        folds into two weights and two biases, so the graph holds no Gemm, channel split or bias add
        for the toolkit to rewrite (see the module docstring)."""
        c = self.fc.out_features // 2
        w, b = self.fc.weight.unsqueeze(-1), self.fc.bias
        s = s.unsqueeze(-1)
        return F.conv1d(s, w[:c], b[:c] + self.one.reshape(-1)), F.conv1d(s, w[c:], b[c:])

    def forward(self, x, s, m=None, inv=None):
        scale, beta = self.projection(s)
        if m is None:
            mu = x.mean(dim=2, keepdim=True)
            d = x - mu
            rs = torch.rsqrt((d * d).mean(dim=2, keepdim=True) + EPS)
            mu, rs = self.stats(mu, rs)
            return scale * ((x - mu) * rs) + beta
        if self.raw_sums:  # the reference documents' form: sums over the axis, divided by the frame count
            length = float(x.shape[-1])
            mu = (F.adaptive_avg_pool1d(x * m, 1) * length) * inv
            d = (x - mu) * m
            rs = torch.rsqrt((F.adaptive_avg_pool1d(d * d, 1) * length) * inv + EPS)
        else:
            mu = F.adaptive_avg_pool1d(x * m, 1) * inv
            d = (x - mu) * m
            rs = torch.rsqrt(F.adaptive_avg_pool1d(d * d, 1) * inv + EPS)
        mu, rs = self.stats(mu, rs)
        d = (x - mu) * m
        return (scale * (d * rs) + beta) * m


# (in channels, kernel, dilation) of the dilated convs rknn-toolkit2 2.5.0 lowers through an axis of
# kernel * L - 1 elements on rk3588, flooding REGTASK lines at any length L (probes/probe_ops.py:
# value 14079 = 11*1280-1 and 8959 = 7*1280-1 at the 10x rate, 84490 = 11*7681-1 at the fine
# rate). Clean at the same shapes: 256 ch k3 d5, k7 d3, k5 d5, k6 d5; 128 ch k7 d5, k9 d5, k11 d3.
SPLIT_SHAPES = frozenset({(256, 7, 5), (256, 11, 3), (256, 11, 5), (128, 11, 5)})


def needs_split(conv: nn.Conv1d) -> bool:
    """Whether `conv` is one of the measured SPLIT_SHAPES."""
    return (conv.in_channels, conv.kernel_size[0], conv.dilation[0]) in SPLIT_SHAPES


class SplitConv(nn.Module):
    """A dilated conv as two narrower ones over the same input, summed.

    Taps [0, ka) and [ka, k) each run as a conv with the original symmetric padding P; the
    first one's output is aligned at 0, the second one's at d*ka (its taps start d*ka later),
    so y = A[..., :L] + B[..., d*ka : d*ka + L] reproduces the original exactly."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        k, d, p = conv.kernel_size[0], conv.dilation[0], conv.padding[0]
        if conv.stride[0] != 1 or conv.groups != 1 or 2 * p != d * (k - 1):
            raise ValueError("SplitConv handles stride-1, ungrouped, 'same'-padded convs only")
        self.ka = (k + 1) // 2
        self.shift = d * self.ka
        cin, cout = conv.in_channels, conv.out_channels
        self.a = nn.Conv1d(cin, cout, self.ka, padding=p, dilation=d, bias=conv.bias is not None)
        self.b = nn.Conv1d(cin, cout, k - self.ka, padding=p, dilation=d, bias=False)
        with torch.no_grad():
            self.a.weight.copy_(conv.weight[:, :, : self.ka])
            self.b.weight.copy_(conv.weight[:, :, self.ka:])
            if conv.bias is not None:
                self.a.bias.copy_(conv.bias)

    def forward(self, x):
        n = x.shape[-1]
        return self.a(x)[..., :n] + self.b(x)[..., self.shift: self.shift + n]


MAX_TRANSPOSE_STRIDE = 7  # ups.0 (stride 10) logs "limit: 0x7, value: 0x9" on rk3588; ups.1 (6) is clean


class PolyphaseUp(nn.Module):
    """ConvTranspose1d(k = 2s, stride s, padding s/2) as a kernel-2 conv to s phases per channel,
    interleaved (Reshape, Transpose, Reshape) and cropped.

    With u = t + p = s*q + r: y[t] = b + w[r] x[q] + w[s + r] x[q - 1], so phase r of output
    column q is a kernel-2 conv over x (padding 1), and the phases interleave into the output.
    Same MACs as the transposed conv; no stride field for the compiler to overflow."""

    def __init__(self, up: nn.ConvTranspose1d):
        super().__init__()
        s, k, p = up.stride[0], up.kernel_size[0], up.padding[0]
        if k != 2 * s or up.groups != 1 or up.output_padding[0] != 0 or up.dilation[0] != 1:
            raise ValueError("PolyphaseUp handles kernel = 2 * stride, ungrouped, no output padding")
        self.s, self.p, self.cout = s, p, up.out_channels
        self.conv = nn.Conv1d(up.in_channels, up.out_channels * s, 2, padding=1)
        w = up.weight.detach()                                 # [in, out, 2s]
        with torch.no_grad():
            phases = torch.stack([w[:, :, s:], w[:, :, :s]], dim=-1)   # [in, out, s, 2]: taps x[q-1], x[q]
            self.conv.weight.copy_(phases.permute(1, 2, 0, 3).reshape(up.out_channels * s, up.in_channels, 2))
            self.conv.bias.copy_(up.bias.detach().repeat_interleave(s))

    def forward(self, x):
        b, n = x.shape[0], x.shape[-1]
        z = self.conv(x)                                       # [b, out*s, n+1]
        z = z.reshape(b, self.cout, self.s, n + 1).transpose(2, 3).reshape(b, self.cout, self.s * (n + 1))
        return z[..., self.p: self.p + self.s * n]


class ResBlock(nn.Module):
    """AdaINResBlock1 with the chosen Snake form."""

    def __init__(self, ref, rw: Rewrites, stats: _Stats):
        super().__init__()
        self.rw = rw
        self.convs1, self.convs2 = nn.ModuleList(), nn.ModuleList()
        self.adain1, self.adain2 = nn.ModuleList(), nn.ModuleList()
        self.alpha1, self.alpha2 = [], []
        for k in range(3):
            for convs, adains, alphas, ref_conv, ref_norm, ref_alpha in (
                    (self.convs1, self.adain1, self.alpha1, ref.convs1[k], ref.adain1[k], ref.alpha1[k]),
                    (self.convs2, self.adain2, self.alpha2, ref.convs2[k], ref.adain2[k], ref.alpha2[k])):
                a = ref_alpha.detach().reshape(-1)
                conv = _copy_conv(ref_conv)
                fc = _copy_linear(ref_norm.fc)
                if rw.alpha_fold:
                    with torch.no_grad():
                        conv.weight.mul_((1.0 / a).reshape(1, -1, 1))
                        c = a.numel()
                        fc.weight[:c].mul_(a.reshape(-1, 1))
                        fc.bias[:c].mul_(a)
                        fc.weight[c:].mul_(a.reshape(-1, 1))
                        fc.bias[c:].mul_(a)
                    one = a
                else:
                    one = torch.ones_like(a)
                if rw.split_dilated and needs_split(conv):
                    conv = SplitConv(conv)
                convs.append(conv)
                adains.append(AdaIN(fc, one, stats, raw_sums=rw.stats == "sum"))
                alphas.append(a.reshape(1, -1, 1))
        for i, a in enumerate(self.alpha1):
            self.register_buffer(f"a1_{i}", a)
        for i, a in enumerate(self.alpha2):
            self.register_buffer(f"a2_{i}", a)

    def snake(self, y, k: int, which: int):
        """Snake of the AdaIN output y (already alpha-scaled when folded)."""
        if self.rw.alpha_fold:
            s = sine(y, self.rw.sine, self.rw.degree)
            return y + s * s
        a = getattr(self, f"a{which}_{k}")
        s = sine(a * y, self.rw.sine, self.rw.degree)
        return y + (1.0 / a) * (s * s)

    def forward(self, x, s, m=None, inv=None):
        for k in range(3):
            xt = self.snake(self.adain1[k](x, s, m, inv), k, 1)
            xt = self.convs1[k](xt)
            xt = self.snake(self.adain2[k](xt, s, m, inv), k, 2)
            xt = self.convs2[k](xt)
            x = xt + x
        return x


def _copy_conv(ref) -> nn.Module:
    kind = nn.ConvTranspose1d if isinstance(ref, nn.ConvTranspose1d) else nn.Conv1d
    kw = dict(stride=ref.stride, padding=ref.padding, dilation=ref.dilation, groups=ref.groups,
              bias=ref.bias is not None)
    conv = kind(ref.in_channels, ref.out_channels, ref.kernel_size, **kw)
    with torch.no_grad():
        conv.weight.copy_(ref.weight)
        if ref.bias is not None:
            conv.bias.copy_(ref.bias)
    return conv


def _copy_linear(ref: nn.Linear) -> nn.Linear:
    fc = nn.Linear(ref.in_features, ref.out_features)
    with torch.no_grad():
        fc.weight.copy_(ref.weight)
        fc.bias.copy_(ref.bias)
    return fc


# --- the trunk -------------------------------------------------------------------------------

class GeneratorTrunk(nn.Module):
    """x, har, style (+ m10, m60 when masked) -> conv_post output, from kokoro's Generator.

    `clamp_count` keeps a window whose masks are all zero finite (its count is clamped to one column
    instead of 0); it is exact whenever a window holds a real frame, and only the in-graph walk needs
    it (its inner windows past the real frames of a padded outer window are all padding)."""

    def __init__(self, ref_generator, rw: Rewrites = ENGINE, clamp_count: bool = False):
        super().__init__()
        self.rw = rw
        self.clamp_count = clamp_count
        self.stats = _Stats()
        g = ref_generator
        self.ups = nn.ModuleList(PolyphaseUp(u) if rw.polyphase and u.stride[0] > MAX_TRANSPOSE_STRIDE
                                 else _copy_conv(u) for u in g.ups)
        self.noise_convs = nn.ModuleList(_copy_conv(c) for c in g.noise_convs)
        self.noise_res = nn.ModuleList(ResBlock(r, rw, self.stats) for r in g.noise_res)
        self.resblocks = nn.ModuleList(ResBlock(r, rw, self.stats) for r in g.resblocks)
        self.conv_post = _copy_conv(g.conv_post)
        if rw.weight_norm:  # where kokoro has it: every conv but noise_convs
            for name, mod in self.named_modules():
                if isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d)) and not name.startswith("noise_convs."):
                    nn.utils.parametrizations.weight_norm(mod)
        self.eval()

    def forward(self, x, har, style, m10=None, m60=None):
        if self.rw.masked and (m10 is None or m60 is None):
            raise ValueError("this trunk is masked: pass m10 [1,1,10W] and m60 [1,1,60W+1]")
        self.stats.start()
        masks = (m10, m60) if self.rw.masked else (None, None)
        for i in range(2):
            m = masks[i]
            inv = self._inverse_count(m) if m is not None else None
            x = F.leaky_relu(x, 0.1)
            src = self.noise_res[i](self.noise_convs[i](har), style, m, inv)
            x = self.ups[i](x)
            if i == 1:  # ReflectionPad1d((1, 0)) as Slice + Concat
                x = torch.cat([x[:, :, 1:2], x], dim=2)
            x = x + src
            xs = self.resblocks[i * KERNELS](x, style, m, inv)
            for j in range(1, KERNELS):
                xs = xs + self.resblocks[i * KERNELS + j](x, style, m, inv)
            x = xs * (1.0 / KERNELS)
            if m is not None:
                x = x * m
        return self.conv_post(F.leaky_relu(x, 0.01))

    def _inverse_count(self, m):
        """1 / GAP(m) (1 / frame count for raw sums), clamped to one column when asked."""
        count = F.adaptive_avg_pool1d(m, 1)
        if self.rw.stats == "sum":
            count = count * float(m.shape[-1])
        if self.clamp_count:
            count = torch.clamp(count, min=1.0 if self.rw.stats == "sum" else 1.0 / m.shape[-1])
        return 1.0 / count


def record_statistics(trunk: GeneratorTrunk, *inputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every AdaIN's (mean, 1/std) of one run of `trunk` on `inputs`, in call order."""
    st = trunk.stats
    st.mode, st.items = "record", []
    try:
        with torch.no_grad():
            trunk(*inputs)
        return list(st.items)
    finally:
        st.mode, st.items = None, []


@contextmanager
def replaying(trunk: GeneratorTrunk, items):
    """Inside, every run of `trunk` normalizes with the recorded `items` instead of its own statistics:
    frozen statistics (a perturbed input with the unperturbed run's statistics) or global statistics
    (a window with the full-length decode's)."""
    st = trunk.stats
    st.mode, st.items = "replay", list(items)
    try:
        yield trunk
    finally:
        st.mode, st.items = None, []


def packed_statistics(items) -> tuple[np.ndarray, np.ndarray]:
    """Recorded statistics as FedStatsTrunk's two inputs: mu and 1/std, [1, S, 1] each, AdaINs in
    call order along the channel axis (S = 9216 for Kokoro-82M: 48 AdaINs)."""
    mu = torch.cat([m.reshape(1, -1, 1) for m, _ in items], dim=1)
    rs = torch.cat([r.reshape(1, -1, 1) for _, r in items], dim=1)
    return mu.numpy().astype(np.float32), rs.numpy().astype(np.float32)


class FedStatsTrunk(nn.Module):
    """The trunk with every AdaIN's statistics taken from two graph inputs (mu, rs [1, S, 1]): the
    engine form of the global-statistics variant (the reference documents' 7-input engine), for the simulator."""

    def __init__(self, trunk: GeneratorTrunk):
        super().__init__()
        self.trunk = trunk

    def forward(self, x, har, style, m10, m60, mu, rs):
        st = self.trunk.stats
        st.mode, st.fed = "feed", (mu, rs)
        try:
            return self.trunk(x, har, style, m10, m60)
        finally:
            st.mode, st.fed = None, None


class InGraphWalk(nn.Module):
    """The runtime's window walk moved inside the graph (--max-axis): a `frames`-wide window cut into
    inner windows of `inner` frames with `context` frames each side (rkstudy.walk.window.plan_windows, at
    trace time), stacked on the batch axis and run through one copy of the trunk, the emitted columns
    concatenated as the runtime stitches them. Every axis is then at most the inner window's fine
    axis (60 inner + 1), so the compiler's 13-bit field and the statistics' range are those of one
    inner window (GlobalAveragePool averages per batch item: each inner window keeps its own
    statistics, as the runtime walk's windows do).

    Batched rather than one trunk copy per window: four copies of the W = 256 trunk (4,523 nodes)
    kept the toolkit's graph optimizer busy past 50 minutes, one batched copy is 1,683 nodes. Windows
    the plan repeats (the last two start at the same frame when the walk is clamped to the end) are
    run once: the toolkit's concat rewrite fails on a Concat that takes the same tensor twice."""

    def __init__(self, trunk: GeneratorTrunk, frames: int, inner: int, context: int):
        super().__init__()
        if inner - 2 * context < 1:
            raise ValueError(f"inner window {inner} leaves nothing to emit with {context} frames of context")
        self.trunk, self.frames, self.inner = trunk, frames, inner
        self.plan = plan_windows(frames, inner - 2 * context, context)
        self.starts = inner_window_starts(frames, inner, context)

    def forward(self, x, har, style, m10, m60):
        r = self.inner

        def stack(t, per: int, extra: int):
            return torch.cat([t[..., per * a: per * (a + r) + extra] for a in self.starts], dim=0)

        g = self.trunk(stack(x, 1, 0), stack(har, FINE, 1), style, stack(m10, COARSE, 0), stack(m60, FINE, 1))
        pieces = []
        for w in self.plan:
            b = self.starts.index(w.start)
            lo = FINE * w.offset
            hi = FINE * (w.offset + w.emit_stop - w.emit_start) + (1 if w.emit_stop == self.frames else 0)
            pieces.append(g[b:b + 1, :, lo:hi])
        return torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0]


def inner_window_starts(frames: int, inner: int, context: int) -> list[int]:
    """The distinct first frames of the in-graph walk's inner windows: its batch, in order."""
    return sorted({w.start for w in plan_windows(frames, inner - 2 * context, context)})


def reference_trunk(gen, x, s, har):
    """kokoro's Generator.forward between the source and the iSTFT, on kokoro's own modules
    (the loop body of istftnet.Generator.forward, verbatim in effect)."""
    for i in range(gen.num_upsamples):
        x = F.leaky_relu(x, negative_slope=0.1)
        x_source = gen.noise_res[i](gen.noise_convs[i](har), s)
        x = gen.ups[i](x)
        if i == gen.num_upsamples - 1:
            x = gen.reflection_pad(x)
        x = x + x_source
        xs = None
        for j in range(gen.num_kernels):
            r = gen.resblocks[i * gen.num_kernels + j](x, s)
            xs = r if xs is None else xs + r
        x = xs / gen.num_kernels
    return gen.conv_post(F.leaky_relu(x))


# --- masks -----------------------------------------------------------------------------------

def masks(real: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """m10 [1,1,10W] and m60 [1,1,60W+1] for `real` real latent frames in a `window`."""
    if not 0 < real <= window:
        raise ValueError(f"real={real} must be in 1..{window}")
    m10 = np.zeros((1, 1, 10 * window), np.float32)
    m10[..., : 10 * real] = 1.0
    m60 = np.zeros((1, 1, 60 * window + 1), np.float32)
    m60[..., : 60 * real + 1] = 1.0
    return m10, m60

