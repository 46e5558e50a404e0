"""One fixed-shape streaming step of the Qwen3 12 Hz vocoder, with all state in one flat fp32 cache.

RKNN has no dynamic shapes and no state, so the decoder is re-traced as

    step(codes [1, 16, B] int64, cache_in [1, N] fp32) -> (audio [1, 1, B*1920] fp32, cache_out [1, N] fp32)

where B (`codes_length`) is compiled in and N is not a function of B. Stepping over a code
sequence from a zeroed cache reproduces one full decode of the same codes (no seams), because
every state the decoder has travels through the cache:

* each causal conv keeps its last `padding` input frames (what the full decode's zero left-pad
  becomes once there is a past);
* each causal transposed conv with kernel 2*stride keeps its last input frame (its output
  overlaps the previous frame's by `stride` samples; the kernel==stride upsamplers keep nothing);
* each attention layer keeps the K (before RoPE) and V of the last `kv_len = sliding_window - 1`
  tokens. Keys are stored unrotated and re-rotated each step at fixed window positions
  0..kv_len+B-1, so RoPE needs no position input (attention depends only on position
  differences) and the cos/sin tables are constants of B;
* one validity flag per history slot (shared by all layers): a zeroed cache has no history, and
  a slot that is not valid must be masked, not attended with K=0 (that would change the softmax
  normaliser and break exactness for the first 71 tokens).

A zeroed cache is therefore exactly "start of stream", and because N does not depend on B, a
16-token step's cache_out feeds the 64-token step directly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .model import SAMPLES_PER_TOKEN

MASK_VALUE = -1.0e4  # finite: exp() of it is 0 in fp16 too, and two of them still fit fp16
CODES, CACHE_IN, AUDIO, CACHE_OUT = "codes", "cache_in", "audio", "cache_out"


class LayoutMismatch(ValueError):
    """A cache or graph does not have the layout this decoder's step expects."""


@dataclass(frozen=True)
class Segment:
    """One state tensor inside the flat cache: `cache[offset:offset+numel].reshape(shape)`."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class CacheLayout:
    """The flat cache's segments in order, plus the attention geometry the contract names."""

    segments: tuple[Segment, ...]
    head_dim: int
    kv_len: int
    num_heads: int
    num_layers: int

    @property
    def numel(self) -> int:
        last = self.segments[-1]
        return last.offset + last.numel

    def by_group(self) -> dict[str, int]:
        """Floats per kind of state (kv, valid flags, conv tails, transposed-conv frames)."""
        out: dict[str, int] = {}
        for s in self.segments:
            kind = ("kv" if s.name.endswith((".k", ".v")) else "valid" if s.name == "attn.valid"
                    else "upconv" if s.name.endswith(".upconv") else "conv")
            out[kind] = out.get(kind, 0) + s.numel
        return out

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """View a flat cache `[1, N]` or `[N]` as named state tensors (for inspection and tests)."""
        flat = np.asarray(flat).reshape(-1)
        if flat.size != self.numel:
            raise LayoutMismatch(f"cache has {flat.size} floats; this layout has {self.numel}")
        return {s.name: flat[s.offset:s.offset + s.numel].reshape(s.shape) for s in self.segments}

    def to_json(self) -> str:
        return json.dumps({"head_dim": self.head_dim, "kv_len": self.kv_len, "num_heads": self.num_heads,
                           "num_layers": self.num_layers,
                           "segments": [[s.name, list(s.shape), s.offset] for s in self.segments]})

    @classmethod
    def from_json(cls, text: str) -> CacheLayout:
        d = json.loads(text)
        segs = tuple(Segment(n, tuple(shape), off) for n, shape, off in d["segments"])
        return cls(segs, d["head_dim"], d["kv_len"], d["num_heads"], d["num_layers"])


def _conv_tail(conv) -> int:
    """Input frames a package CausalConvNet needs from the past (its left pad)."""
    if conv.stride != 1:
        raise LayoutMismatch("a strided causal conv has right padding that depends on the length; "
                             "the 12 Hz decoder has none, so this is not its architecture")
    return int(conv.padding)


def _trans_frames(tconv) -> int:
    """Previous input frames a package CausalTransConvNet needs: 0 for kernel == stride, 1 for
    kernel == 2*stride (the decoder's two kinds)."""
    k, s = tconv.conv.kernel_size[0], tconv.conv.stride[0]
    if k == s:
        return 0
    if k == 2 * s:
        return 1
    raise LayoutMismatch(f"transposed conv with kernel {k}, stride {s}: only k == s and k == 2s are streamed")


def _walk_state(decoder) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every state tensor, in cache order (KV first, then graph order)."""
    cfg = decoder.config
    heads, hd = cfg.num_attention_heads, decoder.pre_transformer.layers[0].self_attn.head_dim
    if cfg.num_key_value_heads != heads:
        raise LayoutMismatch("grouped KV heads are not streamed here (the released decoder has 16/16)")
    kv_len = cfg.sliding_window - 1
    out = []
    for i in range(cfg.num_hidden_layers):
        out += [(f"attn{i}.k", (1, heads, kv_len, hd)), (f"attn{i}.v", (1, heads, kv_len, hd))]
    out.append(("attn.valid", (1, kv_len)))
    pc = decoder.pre_conv
    out.append(("pre_conv", (1, pc.conv.in_channels, _conv_tail(pc))))
    for i, (tconv, block) in enumerate(decoder.upsample):
        if _trans_frames(tconv):
            out.append((f"upsample{i}.upconv", (1, tconv.conv.in_channels, _trans_frames(tconv))))
        out.append((f"upsample{i}.dwconv", (1, block.dwconv.conv.in_channels, _conv_tail(block.dwconv))))
    d0 = decoder.decoder[0]
    out.append(("decoder0", (1, d0.conv.in_channels, _conv_tail(d0))))
    for b, block in enumerate(decoder.decoder[1:-2]):
        tconv = block.block[1]
        if _trans_frames(tconv):
            out.append((f"block{b}.upconv", (1, tconv.conv.in_channels, _trans_frames(tconv))))
        for u, unit in enumerate(block.block[2:]):
            out.append((f"block{b}.res{u}.conv1", (1, unit.conv1.conv.in_channels, _conv_tail(unit.conv1))))
            if _conv_tail(unit.conv2):
                out.append((f"block{b}.res{u}.conv2", (1, unit.conv2.conv.in_channels, _conv_tail(unit.conv2))))
    post = decoder.decoder[-1]
    out.append(("post_conv", (1, post.conv.in_channels, _conv_tail(post))))
    return out


def cache_layout(decoder) -> CacheLayout:
    """The flat-cache layout of `decoder` (a function of the architecture only, never of B)."""
    segs, off = [], 0
    for name, shape in _walk_state(decoder):
        segs.append(Segment(name, tuple(int(d) for d in shape), off))
        off += segs[-1].numel
    attn = decoder.pre_transformer.layers[0].self_attn
    return CacheLayout(tuple(segs), head_dim=attn.head_dim, kv_len=decoder.config.sliding_window - 1,
                       num_heads=decoder.config.num_attention_heads,
                       num_layers=decoder.config.num_hidden_layers)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Snake(nn.Module):
    """The package's SnakeBeta, x + 1/(exp(b)+1e-9) * sin(x * exp(a))^2, with exp(a) and
    1/(exp(b)+1e-9) evaluated once: the same fp32 values, and no Exp/Reciprocal on constants
    left for either exporter to fold (or not: TorchScript at opset 17 leaves 58 of them)."""

    def __init__(self, snake):
        super().__init__()
        shape = (1, -1, 1)
        self.register_buffer("alpha", torch.exp(snake.alpha.detach()).reshape(shape), persistent=False)
        inv = 1.0 / (torch.exp(snake.beta.detach()) + snake.no_div_by_zero)
        self.register_buffer("inv_beta", inv.reshape(shape), persistent=False)

    def forward(self, x):
        return x + self.inv_beta * torch.pow(torch.sin(x * self.alpha), 2)


class StreamingStep(nn.Module):
    """`decoder` as one stateful step over `codes_length` tokens (built from the decoder's weights)."""

    def __init__(self, decoder, codes_length: int, fold_snake: bool = True):
        super().__init__()
        if codes_length < 1:
            raise ValueError(f"codes_length must be >= 1, got {codes_length}")
        self.decoder = decoder
        self.B = int(codes_length)
        self.layout = cache_layout(decoder)
        self.kv_len = self.layout.kv_len
        cfg = decoder.config
        tr = decoder.pre_transformer
        # Codebooks: the package divides by cluster usage at every call; it is a constant.
        tables = []
        for rvq in (decoder.quantizer.rvq_first, decoder.quantizer.rvq_rest):
            for layer in rvq.vq.layers:
                cb = layer._codebook
                tables.append((cb.embedding_sum / cb.cluster_usage.clamp(min=cb.epsilon)[:, None]).detach())
        self.register_buffer("codebooks", torch.stack(tables), persistent=False)  # [Q, K, D]
        self.n_first = decoder.quantizer.n_q_semantic
        # RoPE at window positions 0..kv_len+B-1 (history first, then this step's tokens).
        total = self.kv_len + self.B
        probe = torch.zeros(1, total, cfg.hidden_size)
        cos, sin = tr.rotary_emb(probe, torch.arange(total)[None])
        self.register_buffer("cos", cos[:, None].detach(), persistent=False)  # [1, 1, T, hd]
        self.register_buffer("sin", sin[:, None].detach(), persistent=False)
        # Sliding window: query i (window pos kv_len+i) sees keys at window pos j in [i, kv_len+i].
        i = torch.arange(self.B)[:, None]
        j = torch.arange(total)[None, :]
        band = torch.where((j >= i) & (j <= self.kv_len + i), 0.0, MASK_VALUE)
        self.register_buffer("band", band[None, None], persistent=False)  # [1, 1, B, T]
        # Every Snake of the vocoder, with its exponentials evaluated once (fold_snake=False keeps
        # the package's modules, which trace exp(alpha) into the graph: a census variant).
        snake = _Snake if fold_snake else (lambda m: m)
        blocks = list(decoder.decoder[1:-2])
        self.blk_snake = nn.ModuleList(snake(b.block[0]) for b in blocks)
        self.res_snake = nn.ModuleList(nn.ModuleList(nn.ModuleList([snake(u.act1), snake(u.act2)])
                                                     for u in b.block[2:]) for b in blocks)
        self.post_snake = snake(decoder.decoder[-2])

    # -- cache plumbing -------------------------------------------------------------------------
    def _read(self, cache_in):
        return {s.name: cache_in[:, s.offset:s.offset + s.numel].reshape(s.shape)
                for s in self.layout.segments}

    def _write(self, state: dict) -> torch.Tensor:
        missing = [s.name for s in self.layout.segments if s.name not in state]
        if missing:
            raise LayoutMismatch(f"step produced no state for {', '.join(missing)}")
        return torch.cat([state[s.name].reshape(1, -1) for s in self.layout.segments], dim=1)

    @staticmethod
    def _conv(pkg_conv, x, tail, new: dict, name: str):
        """A package CausalConvNet continued from `tail` ([1, C, K], its last K = padding input
        frames) instead of the zero left-pad of a one-shot decode."""
        if tail is None:
            return pkg_conv.conv(x)
        xin = torch.cat([tail, x], dim=2)
        new[name] = xin[:, :, xin.shape[2] - tail.shape[2]:]
        return pkg_conv.conv(xin)

    @staticmethod
    def _trans(pkg_tconv, x, prev, new: dict, name: str):
        """A package CausalTransConvNet continued from its previous input frame.

        With kernel 2s the output of frame t is W[:s]·x_t + W[s:]·x_{t-1}: convolving
        [prev, x] gives (L+2)s samples, and cropping s at each end (the transposed conv's own
        `padding`, so no Slice on the long output) leaves exactly the full decode's L*s.
        Kernel == stride upsamplers have no overlap and no state.
        """
        conv = pkg_tconv.conv
        if prev is None:
            return pkg_tconv(x)
        s = conv.stride[0]
        new[name] = x[:, :, x.shape[2] - 1:]
        return nn.functional.conv_transpose1d(torch.cat([prev, x], dim=2), conv.weight, conv.bias,
                                              stride=s, padding=s)

    # -- the step -------------------------------------------------------------------------------
    def _quantize(self, codes):
        q = self.decoder.quantizer
        parts = [nn.functional.embedding(codes[:, k], self.codebooks[k]) for k in range(codes.shape[1])]
        first = torch.stack(parts[: self.n_first]).sum(0).transpose(1, 2)
        rest = torch.stack(parts[self.n_first:]).sum(0).transpose(1, 2)
        return q.rvq_first.output_proj(first) + q.rvq_rest.output_proj(rest)

    def _transformer(self, x, state: dict, new: dict):
        tr = self.decoder.pre_transformer
        B, L = self.B, self.kv_len
        h = tr.input_proj(x)  # [1, B, hidden]
        valid = torch.cat([state["attn.valid"], torch.ones(1, B, dtype=x.dtype)], dim=1)  # [1, L+B]
        new["attn.valid"] = valid[:, B:B + L]
        mask = self.band + (1.0 - valid)[:, None, None, :] * MASK_VALUE  # [1, 1, B, L+B]
        cos_q, sin_q = self.cos[:, :, L:], self.sin[:, :, L:]
        for i, layer in enumerate(tr.layers):
            attn = layer.self_attn
            hd = attn.head_dim
            res = h
            hn = layer.input_layernorm(h)
            q = attn.q_proj(hn).view(1, B, -1, hd).transpose(1, 2)
            k = attn.k_proj(hn).view(1, B, -1, hd).transpose(1, 2)
            v = attn.v_proj(hn).view(1, B, -1, hd).transpose(1, 2)
            k_all = torch.cat([state[f"attn{i}.k"], k], dim=2)
            v_all = torch.cat([state[f"attn{i}.v"], v], dim=2)
            new[f"attn{i}.k"] = k_all[:, :, B:B + L]
            new[f"attn{i}.v"] = v_all[:, :, B:B + L]
            qr = q * cos_q + _rotate_half(q) * sin_q
            kr = k_all * self.cos + _rotate_half(k_all) * self.sin
            scores = torch.matmul(qr, kr.transpose(2, 3)) * attn.scaling + mask
            probs = torch.softmax(scores, dim=-1)
            o = torch.matmul(probs, v_all).transpose(1, 2).reshape(1, B, -1)
            h = res + layer.self_attn_layer_scale(attn.o_proj(o))
            res = h
            h = res + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(h)))
        return tr.output_proj(tr.norm(h))

    def forward(self, codes, cache_in):
        dec = self.decoder
        state, new = self._read(cache_in), {}
        hidden = self._quantize(codes)  # [1, codebook_dim, B]
        hidden = self._conv(dec.pre_conv, hidden, state.get("pre_conv"), new, "pre_conv")
        hidden = self._transformer(hidden.transpose(1, 2), state, new).permute(0, 2, 1)
        for i, (tconv, block) in enumerate(dec.upsample):
            hidden = self._trans(tconv, hidden, state.get(f"upsample{i}.upconv"), new, f"upsample{i}.upconv")
            y = self._conv(block.dwconv, hidden, state.get(f"upsample{i}.dwconv"), new, f"upsample{i}.dwconv")
            y = block.gamma * block.pwconv2(block.act(block.pwconv1(block.norm(y.permute(0, 2, 1)))))
            hidden = hidden + y.permute(0, 2, 1)
        wav = self._conv(dec.decoder[0], hidden, state.get("decoder0"), new, "decoder0")
        for b, block in enumerate(dec.decoder[1:-2]):
            wav = self._trans(block.block[1], self.blk_snake[b](wav), state.get(f"block{b}.upconv"), new,
                              f"block{b}.upconv")
            for u, unit in enumerate(block.block[2:]):
                act1, act2 = self.res_snake[b][u]
                c1, c2 = f"block{b}.res{u}.conv1", f"block{b}.res{u}.conv2"
                y = self._conv(unit.conv1, act1(wav), state.get(c1), new, c1)
                y = self._conv(unit.conv2, act2(y), state.get(c2), new, c2)
                wav = wav + y
        wav = self._conv(dec.decoder[-1], self.post_snake(wav), state.get("post_conv"), new, "post_conv")
        return wav.clamp(min=-1, max=1), self._write(new)


def zero_cache(layout: CacheLayout) -> np.ndarray:
    """The start-of-stream cache `[1, N]` float32 (no history: every validity flag 0)."""
    return np.zeros((1, layout.numel), dtype=np.float32)


StepFn = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def torch_step_fn(step: StreamingStep) -> StepFn:
    """`step` as a numpy function (codes [1,Q,B], cache [1,N]) -> (audio [B*1920], cache [1,N])."""

    @torch.no_grad()
    def run(codes, cache):
        wav, out = step(torch.as_tensor(codes, dtype=torch.long), torch.as_tensor(cache))
        return wav.reshape(-1).numpy(), out.numpy()

    return run


def stepwise_decode(steps: dict[int, StepFn], codes: np.ndarray, schedule: Sequence[int],
                    cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode `codes [1, Q, T]` group by group: `schedule` lists each group's size (a key of
    `steps`), and each group continues from the previous group's cache. Returns (PCM, cache)."""
    if sum(schedule) != codes.shape[-1]:
        raise ValueError(f"schedule covers {sum(schedule)} tokens, codes have {codes.shape[-1]}")
    pcm, pos = [], 0
    for n in schedule:
        if n not in steps:
            raise KeyError(f"no step compiled for {n} tokens; have {sorted(steps)}")
        wav, cache = steps[n](codes[..., pos:pos + n], cache)
        pcm.append(np.asarray(wav).reshape(-1)[: n * SAMPLES_PER_TOKEN])
        pos += n
    return np.concatenate(pcm), cache


def layout_summary(layout: CacheLayout) -> dict:
    """The contract numbers and the cache broken down by kind of state."""
    return {"cache_numel": layout.numel, "head_dim": layout.head_dim, "kv_len": layout.kv_len,
            "num_heads": layout.num_heads, "num_layers": layout.num_layers, **{
                f"floats_{k}": v for k, v in layout.by_group().items()}}


