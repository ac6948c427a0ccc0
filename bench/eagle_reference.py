"""EAGLE against its authors' code (issue 67): the same tile features, the same weights.

A store of CMU-1-Small-Region gets seeded N(0, 1) features of virchow2-cls (1,280-d) and
chief-ctranspath (768-d) on one plan at 2 um/px, 224 px (the tiles EAGLE's README asks for;
stepping --stride px, so the slide has more than 25). The authors' CHIEF (``models/CHIEF.py``
of a local copy of KatherLab/EAGLE, ``CHIEF(size_arg="small", dropout=True, n_classes=2)``,
as their eagle_features.py builds it) draws its own random weights (its
``initialize_weights``, seeded), which are saved as its checkpoint is published (a torch
state dict). Theirs: ``model(ctranspath)["attention_raw"]``, the top 25 by ``torch.topk``
and the mean of those tiles' Virchow2 features (their ``get_topk_tiles``). Ours: `tilestore
embed --slide-encoder eagle --slide-weights` on the store (fp32, CPU). Prints a table and
writes JSON.

    python bench/eagle_reference.py --eagle PATH/EAGLE [--stride 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def theirs(eagle: Path, weights: Path, virchow: np.ndarray, ctranspath: np.ndarray) -> np.ndarray:
    """The authors' EAGLE vector of one slide, their CHIEF's weights saved to `weights`."""
    sys.path.insert(0, str(eagle))
    from models.CHIEF import CHIEF  # the authors' module, from their repository's copy

    torch.manual_seed(0)
    model = CHIEF(size_arg="small", dropout=True, n_classes=2).eval()
    torch.save(model.state_dict(), weights)
    with torch.no_grad():
        attention_raw = model(torch.from_numpy(ctranspath))["attention_raw"]
    k = min(25, attention_raw.size(1))
    _, top = torch.topk(attention_raw, k, dim=1)
    return torch.from_numpy(virchow)[top.squeeze()].mean(dim=0).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--eagle", type=Path, required=True, help="a copy of KatherLab/EAGLE")
    parser.add_argument("--stride", type=int, default=16)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "eagle_reference.json")
    args = parser.parse_args()
    import tilestore
    from tilestore.embed.slides import embed_slides
    from tilestore.embeddings.slides import read_slide_vector
    from tilestore.embeddings.write import write_features
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan

    data = Path(os.environ.get("TILESTORE_DATA", HERE.parent.parent / "shared" / "data"))
    slide_file = next(data.rglob("CMU-1-Small-Region.svs"))
    with tempfile.TemporaryDirectory() as work:
        store = tilestore.convert(slide_file, Path(work) / "s").store
        slide = tilestore.open_slide(store)
        options = PlanOptions(mpp=2.0, tile=224, stride=args.stride, min_tissue=0.0, name="eagle")
        plan = plan_over_tissue(slide, options)
        save_plan(slide, plan)
        rng = np.random.default_rng(0)
        virchow = rng.standard_normal((len(plan), 1280)).astype(np.float32)
        ctranspath = rng.standard_normal((len(plan), 768)).astype(np.float32)
        write_features(store, {"name": "virchow2-cls"}, virchow, plan="eagle")
        write_features(store, {"name": "chief-ctranspath"}, ctranspath, plan="eagle")
        weights = Path(work) / "CHIEF_pretraining.pth"
        reference = theirs(args.eagle, weights, virchow, ctranspath)
        report = embed_slides([store], "eagle", weights=weights, device="cpu", precision="fp32")
        if report.failures:
            raise SystemExit(report.failures[0].why)
        ours = read_slide_vector(store, "virchow2-cls", "eagle")["vector"]
    cosine = float(ours @ reference / (np.linalg.norm(ours) * np.linalg.norm(reference)))
    row = {
        "encoder": "eagle",
        "tiles": len(virchow),
        "reference": "authors: KatherLab/EAGLE models/CHIEF.py attention_raw, top 25, mean",
        "cosine": cosine,
        "max_abs_diff": float(np.abs(ours - reference).max()),
        "max_abs": float(np.abs(reference).max()),
    }
    print("| encoder | tiles | reference | cosine | max abs diff |")
    print("|---|---|---|---|---|")
    print(f"| eagle | {row['tiles']} | {row['reference']} | {cosine:.6f} | "
          f"{row['max_abs_diff']:.1e} |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
