"""Mamba-2 (Dao and Gu 2024, "Transformers are SSMs"), the layer as mamba_ssm's ``Mamba2``
computes it, in plain PyTorch: no CUDA kernels, no Triton, the same on the CPU and a GPU.

One layer: a projection into the gate z, the SSM input x, its B and C and a step dt per
head; a causal depthwise convolution (width 4) and SiLU over x, B, C; the selective state
space scan with a scalar decay per head (SSD); the skip D x; a gated RMS norm,
norm(y * silu(z)); the output projection. The parameters are named as mamba_ssm names
them (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm.weight``,
``out_proj``), so its checkpoints load as they are.

The scan is SSD's chunked form: within a chunk of tiles the output is a masked
(chunk x chunk) product, and between chunks the (heads, head_dim, d_state) state is
carried, one chunk at a time: memory in the chunk, not the sequence (100,000 tiles take
no more than 1,000). It runs in float32 whatever autocast asks, as mamba_ssm's kernels
keep their states in float32.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 256  # tiles per SSD chunk: mamba_ssm's default chunk_size


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """The SSM's output y (n, heads, head_dim) of the recurrence
    h_t = exp(dt_t a) h_{t-1} + dt_t x_t b_t^T, y_t = h_t c_t, from a zero state.

    x: (n, heads, head_dim); dt: (n, heads), positive; a: (heads,), negative;
    b, c: (n, groups, d_state), each group's heads consecutive."""
    n, heads, head_dim = x.shape
    groups, d_state = b.shape[1:]
    per = heads // groups  # heads of a group share its b and c
    xs, dts = x.transpose(0, 1), dt.T  # (heads, n, head_dim), (heads, n)
    bs, cs = b.transpose(0, 1), c.transpose(0, 1)  # (groups, n, d_state)
    state = x.new_zeros(groups, per * head_dim, d_state)  # the heads' states, by group
    out = []
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        bk, ck = bs[:, start:end], cs[:, start:end]
        log_decay = torch.cumsum(dts[:, start:end] * a[:, None], dim=1)  # (heads, l)
        weighted = xs[:, start:end] * dts[:, start:end, None]  # dt_u x_u: (heads, l, head_dim)
        # within the chunk: y_t += sum_{u <= t} (c_t . b_u) exp(L_t - L_u) dt_u x_u
        gaps = log_decay[:, :, None] - log_decay[:, None, :]  # (heads, t, u)
        causal = torch.ones(end - start, end - start, dtype=torch.bool, device=x.device).tril()
        decay = torch.exp(gaps.masked_fill(~causal, float("-inf")))
        scores = (ck @ bk.transpose(1, 2)).repeat_interleave(per, dim=0) * decay
        y = scores @ weighted
        # from before the chunk: y_t += exp(L_t) (state c_t)
        carried = (ck @ state.transpose(1, 2)).view(groups, end - start, per, head_dim)
        y = y + carried.transpose(1, 2).reshape(heads, end - start, head_dim) * torch.exp(
            log_decay
        ).unsqueeze(-1)
        out.append(y)
        # the state at the chunk's end: decayed, plus the chunk's inputs decayed to its end
        to_end = weighted * torch.exp(log_decay[:, -1:] - log_decay).unsqueeze(-1)
        to_end = to_end.view(groups, per, end - start, head_dim).transpose(1, 2)
        added = to_end.reshape(groups, end - start, per * head_dim).transpose(1, 2) @ bk
        kept = torch.exp(log_decay[:, -1]).view(groups, per, 1).repeat_interleave(head_dim, 1)
        state = state * kept + added
    return torch.cat(out, dim=1).transpose(0, 1)


def _float32(device: torch.device):
    """Autocast off (the meta device, which builds for free, has none)."""
    if device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


class GatedRMSNorm(nn.Module):
    """mamba_ssm's gated RMSNorm with its gate after (norm_before_gate=False) and one
    group: rms-normalise y * silu(z), then scale (in float32)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        gated = y.float() * F.silu(z.float())
        scale = torch.rsqrt(gated.square().mean(-1, keepdim=True) + self.eps)
        return gated * scale * self.weight.float()


class Mamba2(nn.Module):
    """One Mamba-2 layer on one sequence: (n, dim) -> (n, dim). mamba_ssm's defaults:
    expand 2, head_dim 64, one group, a scalar D per head, no projection biases, the
    convolution with its bias, dt unbounded (dt_limit (0, inf))."""

    def __init__(
        self,
        dim: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        head_dim: int = 64,
        groups: int = 1,
    ) -> None:
        super().__init__()
        inner = expand * dim
        self.inner, self.d_state, self.groups, self.head_dim = inner, d_state, groups, head_dim
        self.heads = inner // head_dim
        conv_dim = inner + 2 * groups * d_state
        # the projection's order: z, x, B, C, dt
        self.in_proj = nn.Linear(dim, inner + conv_dim + self.heads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1)
        self.dt_bias = nn.Parameter(torch.zeros(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GatedRMSNorm(inner)
        self.out_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        n = u.shape[0]
        z, xbc, dt = self.in_proj(u).split([self.inner, self.conv1d.in_channels, self.heads], -1)
        xbc = F.silu(self.conv1d(xbc.T[None])[0, :, :n].T)  # causal: the first n outputs
        x, b, c = xbc.split(
            [self.inner, self.groups * self.d_state, self.groups * self.d_state], -1
        )
        with _float32(u.device):
            x = x.float().view(n, self.heads, self.head_dim)
            dt = F.softplus(dt.float() + self.dt_bias.float())
            a = -torch.exp(self.A_log.float())
            b = b.float().view(n, self.groups, self.d_state)
            c = c.float().view(n, self.groups, self.d_state)
            y = ssd_scan(x, dt, a, b, c) + x * self.D.float()[:, None]
        return self.out_proj(self.norm(y.reshape(n, self.inner), z).to(z.dtype))
