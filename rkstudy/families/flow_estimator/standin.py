"""A DiT-shaped stand-in for the CosyVoice3 flow-matching estimator, with seeded random weights (host).

Why a stand-in: the reference documents' IOVA measurements are of a CosyVoice3 flow estimator (a DiT) compiled at
fixed S; nothing here may fetch its checkpoint, and the memory an engine asks for depends on the
graph's shapes, not on the values of its weights. So this module writes its own DiT with the same
input contract and the same layer shapes as the upstream estimator, fills it with seeded random
weights, and exports it at a fixed S. Every size measured from it is the stand-in's own, and its
outputs mean nothing as audio.

The contract and shapes were read from FunAudioLLM/CosyVoice @ ace7c47 (this file copies no code):
* cosyvoice/flow/flow_matching.py, forward_estimator: inputs x [B,80,S], mask [B,1,S], mu [B,80,S],
  t [B], spks [B,80], cond [B,80,S]; output [B,80,S] (cosyvoice/bin/export_onnx.py names it
  estimator_out).
* examples/libritts/cosyvoice3/conf/cosyvoice3.yaml, estimator DiT: dim 1024, depth 22, heads 16,
  dim_head 64, ff_mult 2, mel_dim 80, mu_dim 80, spk_dim 80.
* cosyvoice/flow/DiT/{dit.py,modules.py}: sinusoidal timestep embedding (256) -> MLP; input
  projection of cat(x, cond, mu, spks) then a causal grouped conv position embedding (k=31,
  groups=16, Mish, twice); per block AdaLayerNormZero (6 modulations from t), rotary self-attention
  with a key mask, tanh-GELU feed-forward; AdaLayerNormZero_Final and a projection to 80 mels.

Deviations, all shape-neutral: the rotary embedding rotates halves (not interleaved pairs), the
key mask is an additive -1e4 bias (fp16-safe) instead of a boolean SDPA mask, and the depth is a
parameter (the stand-in is built shallow so a build takes minutes; the per-layer shapes are the
upstream ones).

Host side: torch and onnx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...process import known_warnings

INPUTS = ("x", "mask", "mu", "t", "spks", "cond")
OUTPUT = "estimator_out"


@dataclass(frozen=True)
class DiTConfig:
    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80
    conv_kernel: int = 31
    conv_groups: int = 16
    freq_embed_dim: int = 256
    # "key": the key mask as an additive [B,1,1,S] bias. "dense": the same bias materialized as
    # [B,1,S,S], the shape CosyVoice's export hands attention (mask.repeat(1, S, 1).unsqueeze(1) in
    # dit.py). Same values, same outputs; the graphs differ in what the compiler can fuse.
    attn_bias: str = "key"
    # "sdpa": matmul -> softmax -> matmul, which rknn-toolkit2 2.5.0 fuses into one exSDPAttention op
    # (the [H,S,S] scores are never planned as a tensor). "gated": the softmax output multiplied by
    # the key mask before the value matmul; the values are the same (masked keys already carry ~0
    # probability), the pattern is not one the compiler fuses, so the scores are planned tensors.
    attn_form: str = "sdpa"


COSYVOICE3 = DiTConfig()  # cosyvoice3.yaml's estimator


def standin_config(depth: int = 2, attn_bias: str = "key", attn_form: str = "sdpa") -> DiTConfig:
    """The upstream widths at a shallow depth (the layer shapes, not the layer count, are what the
    compiled intermediates scale with)."""
    if attn_bias not in ("key", "dense"):
        raise ValueError(f"attn_bias is 'key' or 'dense', not {attn_bias!r}")
    if attn_form not in ("sdpa", "gated"):
        raise ValueError(f"attn_form is 'sdpa' or 'gated', not {attn_form!r}")
    return replace(COSYVOICE3, depth=depth, attn_bias=attn_bias, attn_form=attn_form)


def parameter_count(cfg: DiTConfig) -> int:
    """Parameters of the estimator at `cfg`, counted on the meta device (nothing is allocated, so
    the full 331 M-parameter shape costs no memory)."""
    with torch.device("meta"):
        return sum(p.numel() for p in DiTEstimator(cfg).parameters())


class _Timestep(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        half = cfg.freq_embed_dim // 2
        scale = math.log(10000) / (half - 1)
        self.register_buffer("freqs", torch.exp(torch.arange(half).float() * -scale), persistent=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.freq_embed_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))

    def forward(self, t):  # [B] -> [B, dim]
        arg = 1000.0 * t[:, None] * self.freqs[None, :]
        return self.mlp(torch.cat([arg.sin(), arg.cos()], dim=-1))


class _CausalConvPos(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.k = cfg.conv_kernel
        self.conv1 = nn.Conv1d(cfg.dim, cfg.dim, cfg.conv_kernel, groups=cfg.conv_groups)
        self.conv2 = nn.Conv1d(cfg.dim, cfg.dim, cfg.conv_kernel, groups=cfg.conv_groups)

    def forward(self, x, keep):  # x [B, S, D], keep [B, S, 1]
        h = (x * keep).transpose(1, 2)
        h = F.mish(self.conv1(F.pad(h, (self.k - 1, 0))))
        h = F.mish(self.conv2(F.pad(h, (self.k - 1, 0))))
        return h.transpose(1, 2) * keep


def _rope_tables(seq_len: int, dim_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim_head, 2).float() / dim_head))
    ang = torch.outer(torch.arange(seq_len).float(), inv)
    ang = torch.cat([ang, ang], dim=-1)  # [S, dim_head]
    return ang.cos(), ang.sin()


def _rotate(x, cos, sin):  # x [B, H, S, Dh]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class _Block(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        inner = cfg.heads * cfg.dim_head
        self.heads, self.dim_head, self.dim = cfg.heads, cfg.dim_head, cfg.dim
        self.ada = nn.Linear(cfg.dim, 6 * cfg.dim)
        self.q, self.k, self.v = (nn.Linear(cfg.dim, inner) for _ in range(3))
        self.out = nn.Linear(inner, cfg.dim)
        self.ff1 = nn.Linear(cfg.dim, cfg.dim * cfg.ff_mult)
        self.ff2 = nn.Linear(cfg.dim * cfg.ff_mult, cfg.dim)

    def _heads(self, x):  # [B, S, H*Dh] -> [B, H, S, Dh]
        b, s, _ = x.shape
        return x.reshape(b, s, self.heads, self.dim_head).transpose(1, 2)

    def forward(self, x, temb, keep, bias, cos, sin, gate=None):
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.ada(F.silu(temb))[:, None].chunk(6, dim=-1)
        h = F.layer_norm(x, (self.dim,), eps=1e-6) * (1 + scale_a) + shift_a
        q = _rotate(self._heads(self.q(h)), cos, sin)
        k = _rotate(self._heads(self.k(h)), cos, sin)
        v = self._heads(self.v(h))
        att = torch.softmax(q @ k.transpose(-1, -2) * (self.dim_head ** -0.5) + bias, dim=-1)
        if gate is not None:
            att = att * gate
        a = (att @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        x = x + gate_a * (self.out(a) * keep)
        h = F.layer_norm(x, (self.dim,), eps=1e-6) * (1 + scale_f) + shift_f
        return x + gate_f * self.ff2(F.gelu(self.ff1(h), approximate="tanh"))


class DiTEstimator(nn.Module):
    """forward(x, mask, mu, t, spks, cond) -> [B, 80, S], the CosyVoice3 estimator contract."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.time = _Timestep(cfg)
        self.proj_in = nn.Linear(cfg.mel_dim * 2 + cfg.mu_dim + cfg.spk_dim, cfg.dim)
        self.conv_pos = _CausalConvPos(cfg)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.ada_final = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)

    def forward(self, x, mask, mu, t, spks, cond):
        seq_len = x.shape[-1]
        keep = mask.transpose(1, 2)  # [B, S, 1]
        bias = (mask[:, :, None, :] - 1.0) * 1e4  # [B, 1, 1, S]: masked keys get -1e4
        if self.cfg.attn_bias == "dense":
            bias = bias.expand(-1, -1, seq_len, -1) + torch.zeros(1, 1, seq_len, 1)  # [B, 1, S, S]
        temb = self.time(t)
        h = torch.cat([x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2),
                       spks[:, None, :].expand(-1, seq_len, -1)], dim=-1)
        h = self.proj_in(h)
        h = self.conv_pos(h, keep) + h
        cos, sin = _rope_tables(seq_len, self.cfg.dim_head)
        gate = mask[:, :, None, :] if self.cfg.attn_form == "gated" else None  # [B, 1, 1, S]
        for block in self.blocks:
            h = block(h, temb, keep, bias, cos, sin, gate)
        scale, shift = self.ada_final(F.silu(temb))[:, None].chunk(2, dim=-1)
        h = F.layer_norm(h, (self.cfg.dim,), eps=1e-6) * (1 + scale) + shift
        return self.proj_out(h).transpose(1, 2)


def build(cfg: DiTConfig, seed: int = 0) -> DiTEstimator:
    """The estimator with seeded random weights (torch's default init under `seed`): the weights are
    random, so nothing it outputs is speech."""
    torch.manual_seed(seed)
    return DiTEstimator(cfg).eval()


def input_shapes(seq_len: int, cfg: DiTConfig = COSYVOICE3) -> dict[str, list[int]]:
    return {"x": [1, cfg.mel_dim, seq_len], "mask": [1, 1, seq_len], "mu": [1, cfg.mu_dim, seq_len],
            "t": [1], "spks": [1, cfg.spk_dim], "cond": [1, cfg.mel_dim, seq_len]}


def random_inputs(seq_len: int, cfg: DiTConfig = COSYVOICE3, seed: int = 0,
                  valid: int | None = None) -> dict[str, np.ndarray]:
    """Inputs at the scales the estimator sees: unit-normal noisy mel, mu and cond, t in [0, 1], a
    mask of ones over the first `valid` frames (all of them by default)."""
    rng = np.random.default_rng(seed)
    valid = seq_len if valid is None else valid
    mask = np.zeros((1, 1, seq_len), np.float32)
    mask[..., :valid] = 1.0
    return {"x": rng.standard_normal((1, cfg.mel_dim, seq_len)).astype(np.float32),
            "mask": mask,
            "mu": rng.standard_normal((1, cfg.mu_dim, seq_len)).astype(np.float32),
            "t": rng.uniform(0, 1, (1,)).astype(np.float32),
            "spks": rng.standard_normal((1, cfg.spk_dim)).astype(np.float32),
            "cond": rng.standard_normal((1, cfg.mel_dim, seq_len)).astype(np.float32) * (mask > 0)}


def export(model: DiTEstimator, seq_len: int, path, opset: int = 17) -> Path:
    """ONNX at a fixed S (RKNN has no dynamic shapes); the producer folds it before building."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    example = tuple(torch.from_numpy(v) for v in random_inputs(seq_len, model.cfg).values())
    with torch.no_grad(), known_warnings("slice-folding"):
        torch.onnx.export(model, example, str(path), input_names=list(INPUTS), output_names=[OUTPUT],
                          opset_version=opset, do_constant_folding=True, dynamo=False)
    return path
