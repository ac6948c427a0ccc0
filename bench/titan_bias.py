"""TITAN's attention bias, one chunk on the GPU: 30,001 tokens (30,000 tiles of a square
grid and the class token), 186 query rows (what 256 MB of float32 scores allow), 12 heads,
fp16. The bias made as before 1f9fbdd (`torch.cdist` in its exact mode, then a copy to
fp16) against as now (broadcast differences into an fp16 mask with 16-byte aligned rows);
ms to make it and ms to attend with it, and whether the two are equal.

    python3 bench/titan_bias.py
"""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F

TOKENS, ROWS, HEADS, SIDE = 30001, 186, 12, 174


def main() -> None:
    grid = torch.meshgrid(torch.arange(SIDE), torch.arange(SIDE), indexing="ij")
    cells = torch.stack(grid, -1).reshape(-1, 2)[: TOKENS - 1].float().cuda()
    slopes = torch.rand(HEADS, 1, 1, device="cuda")

    def by_cdist() -> torch.Tensor:
        out = torch.zeros(HEADS, ROWS, TOKENS, device="cuda")
        d = torch.cdist(cells[:ROWS], cells, compute_mode="donot_use_mm_for_euclid_dist")
        out[:, :, 1:] = -slopes * d
        return out.to(torch.float16)

    def by_differences() -> torch.Tensor:
        wide = -(-TOKENS // 8) * 8
        out = torch.zeros(HEADS, ROWS, wide, device="cuda", dtype=torch.float16)[..., :TOKENS]
        rows = cells[:ROWS]
        dx, dy = rows[:, :1] - cells[:, 0], rows[:, 1:] - cells[:, 1]
        out[:, :, 1:] = -slopes * torch.sqrt(dx * dx + dy * dy)
        return out

    q = torch.randn(HEADS, ROWS, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(HEADS, TOKENS, 64, device="cuda", dtype=torch.float16)
    found = {}
    for name, make in (("cdist", by_cdist), ("differences", by_differences)):
        mask = [make() for _ in range(3)][-1]
        found[name] = {"bias_ms": _ms(make), "attention_ms": _ms(
            lambda m=mask: F.scaled_dot_product_attention(q, k, k, attn_mask=m))}  # fmt: skip
        print(f"{name}: bias {found[name]['bias_ms']:.2f} ms, attention with it "
              f"{found[name]['attention_ms']:.2f} ms a chunk")  # fmt: skip
    found["equal"] = bool(torch.equal(by_cdist(), by_differences().contiguous()))
    print("equal:", found["equal"])
    print(json.dumps(found))


def _ms(call, repeats: int = 20) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats * 1e3


if __name__ == "__main__":
    main()
