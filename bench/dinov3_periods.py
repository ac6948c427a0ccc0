"""DINOv3's rotary periods: timm's port against the authors' own model, with the periods
timm computes (float32) and with them rounded to bfloat16 as the authors' release stores
them (what tilestore loads: `Arch(periods="bf16")`, issue 67).

For each size, the authors' model (facebookresearch/dinov3's hub constructor,
``pretrained=False``; ViT-7B at `--depth-7b` blocks, its weights being 27 GB of float32 a
copy) gets random weights (`bench/encoders.randomize`), its periods stored in bfloat16 and
read back, as its release is; timm's model loads the same weights through timm's own
``checkpoint_filter_fn``. Both embed the same random normalised 256 px batch on the CPU in
float32: the class token after the final norm. Prints a table, writes JSON.

    python bench/dinov3_periods.py --dinov3 PATH/TO/dinov3
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from encoders import randomize  # noqa: E402

SIZES = (
    ("dinov3_vits16", "vit_small_patch16_dinov3_qkvb"),
    ("dinov3_vits16plus", "vit_small_plus_patch16_dinov3_qkvb"),
    ("dinov3_vitb16", "vit_base_patch16_dinov3_qkvb"),
    ("dinov3_vitl16", "vit_large_patch16_dinov3_qkvb"),
    ("dinov3_vith16plus", "vit_huge_plus_patch16_dinov3_qkvb"),
    ("dinov3_vit7b16", "vit_7b_patch16_dinov3"),
)


def one(backbones, maker: str, arch: str, depth: int | None) -> dict:
    import timm

    made = backbones._make_dinov3_vit
    if depth is not None:  # the constructor fixes its depth: given here instead
        backbones._make_dinov3_vit = lambda **kw: made(**{**kw, "depth": depth})
    try:
        theirs = getattr(backbones, maker)(pretrained=False).eval()
    finally:
        backbones._make_dinov3_vit = made
    randomize(theirs, seed=len(maker))
    state = {k: v.detach().clone() for k, v in theirs.state_dict().items()}
    state["rope_embed.periods"] = state["rope_embed.periods"].to(torch.bfloat16)  # as released
    theirs.load_state_dict(state, strict=True)
    extra = {} if depth is None else {"depth": depth}
    model = timm.create_model(arch, pretrained=False, num_classes=0, img_size=256, **extra)
    model.load_state_dict(timm.models.eva.checkpoint_filter_fn(state, model), strict=True)
    model.eval()
    x = torch.randn(4, 3, 256, 256, generator=torch.Generator().manual_seed(0))
    row = {"authors": maker, "timm": arch, "depth": depth or len(theirs.blocks)}
    with torch.inference_mode():
        reference = theirs.forward_features(x)["x_norm_clstoken"].double()
        for periods in ("float32", "bfloat16"):
            if periods == "bfloat16":
                model.rope.periods.copy_(model.rope.periods.to(torch.bfloat16).float())
            ours = model.forward_features(x)[:, 0].double()
            cosine = torch.nn.functional.cosine_similarity(ours, reference).min().item()
            row[periods] = {"max_abs_diff": (ours - reference).abs().max().item(),
                            "cosine_min": cosine}  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dinov3", type=Path, required=True, help="facebookresearch/dinov3")
    parser.add_argument("--depth-7b", type=int, default=2)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "dinov3_periods.json")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sys.path.insert(0, str(args.dinov3))
    backbones = importlib.import_module("dinov3.hub.backbones")
    rows = []
    for maker, arch in SIZES:
        started = time.perf_counter()
        rows.append(one(backbones, maker, arch, args.depth_7b if "7b" in maker else None))
        rows[-1]["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{platform.node()}, CPU, float32, torch {torch.__version__}")
    print("| authors | timm | blocks | float32 periods: max abs diff / cosine min | "
          "bfloat16 periods: max abs diff / cosine min |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[p]['max_abs_diff']:.2e} / {r[p]['cosine_min']:.9f}"
                 for p in ("float32", "bfloat16")]  # fmt: skip
        print(f"| {r['authors']} | {r['timm']} | {r['depth']} | {cells[0]} | {cells[1]} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
