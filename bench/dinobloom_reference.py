"""DinoBloom-S against its authors' code (issue 67): the same weights, the same real tiles.

The authors' model is DINOv2's ``dinov2_vits14`` from the `dinov2/hub` of a local copy of
marrlab/DinoBloom (what ``torch.hub.load("facebookresearch/dinov2", ...)`` builds, as their
``get_dino_finetuned_downloaded`` and STAMP's loader do), its position table replaced by one
of 257 tokens (224 px), drawn at random (seeded) and saved as DINOv2's training saves its
teacher ({"teacher": {"backbone.<name>": ...}}, with DINO's head beside it). Theirs: the
teacher's backbone loaded strictly, ``model(x)`` (the class token after the final norm), x
the tiles through ``ToTensor`` and ImageNet's ``Normalize``. Ours: the registered
``dinobloom-s`` with its pin and URL pointed at that file (``file://``, fetched into a
scratch cache as from Zenodo), through its own transform. fp32, TF32 off, 16 real tiles of
CMU-1-Small-Region at 224 px. Prints a table and writes JSON.

    python bench/dinobloom_reference.py --dinobloom PATH/DinoBloom
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def authors_model(dinobloom: Path) -> torch.nn.Module:
    sys.path.insert(0, str(dinobloom))
    from dinov2.hub.backbones import dinov2_vits14  # the authors' copy of DINOv2's hub

    model = dinov2_vits14(pretrained=False)
    model.pos_embed = torch.nn.Parameter(torch.zeros(1, 257, 384))  # as their loader does
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dinobloom", type=Path, required=True, help="a copy of marrlab/DinoBloom")
    parser.add_argument("--tiles", type=int, default=16)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "dinobloom_reference.json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    from encoders import real_tiles

    from tilestore.embed.models import get_model, load_model

    theirs_model = authors_model(args.dinobloom)
    tiles = real_tiles(224, args.tiles)  # (n, 224, 224, 3) uint8
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "DinoBloom-S.pth"
        teacher = {f"backbone.{k}": v for k, v in theirs_model.state_dict().items()}
        teacher["backbone.mask_token"] = torch.zeros(1, 384)
        teacher["dino_head.mlp.0.weight"] = torch.ones(8, 384)
        torch.save({"teacher": teacher}, path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        os.environ["TILESTORE_CACHE"] = str(Path(work) / "cache")
        spec = replace(get_model("dinobloom-s"), repo=path.as_uri(), sha256=digest)
        loaded = load_model(spec)
        x = torch.from_numpy(tiles)
        with torch.inference_mode():
            ours = loaded.module(loaded.transform(x)).numpy()
            # theirs: ToTensor (/255) and Normalize, as STAMP's and the authors' transforms
            mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
            std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
            normalised = (x.permute(0, 3, 1, 2).float() / 255 - mean) / std
            model = authors_model(args.dinobloom)
            model.load_state_dict(  # as their loader: the heads dropped, strictly
                {k.removeprefix("backbone."): v for k, v in teacher.items()
                 if k.startswith("backbone.")},
                strict=True,
            )  # fmt: skip
            theirs = model(normalised).numpy()
    cos = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    row = {
        "encoder": "dinobloom-s",
        "tiles": len(tiles),
        "reference": "authors: marrlab/DinoBloom dinov2 hub dinov2_vits14, 257 positions, teacher",
        "cosine_min": float(cos.min()),
        "max_abs_diff": float(np.abs(ours - theirs).max()),
        "max_abs": float(np.abs(theirs).max()),
    }
    print("| encoder | tiles | reference | cosine min | max abs diff |")
    print("|---|---|---|---|---|")
    print(f"| dinobloom-s | {row['tiles']} | {row['reference']} | {row['cosine_min']:.6f} | "
          f"{row['max_abs_diff']:.1e} |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
