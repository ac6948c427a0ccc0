"""What makes two embeddings groups' features comparable: the recipe a run records.

Two stores embedded "with the same model" are one population only where the weights, the
pooling, any projection, the precision, the input size and the transform are the same: a
CLS token is not a CLS + mean vector, and bf16 features are not fp32 ones. `recipe` reads
those facts from a group's attributes (`tilestore.embeddings.write.RunIdentity`), `differences`
names what two recipes disagree on; a cohort of mixed recipes is refused when opened
(`tilestore.embeddings.read.open_embeddings`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# the model facts compared (``weights``, a path on the machine that ran, is not)
MODEL_FACTS = (
    "name",
    "repo",
    "revision",
    "architecture",
    "pooling",
    "projection",
    "output_dim",
    "input_size",
    "transform_sha",
)


def transform_hash(described: dict[str, Any]) -> str:
    """A short hash of a transform's description (sizes, interpolation, mean, std)."""
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recipe(meta: dict[str, Any]) -> dict[str, Any]:
    """The recipe of a group from its ``tilestore`` attributes. Groups written before a fact
    was recorded lack it, and are compared on the facts they have; their transform's hash is
    made from the transform they recorded."""
    model = meta.get("model") or {}
    out = {key: model[key] for key in MODEL_FACTS if key in model}
    if "transform_sha" not in out and isinstance(model.get("transform"), dict):
        out["transform_sha"] = transform_hash(model["transform"])
    if "input_size" not in out and isinstance(model.get("transform"), dict):
        out["input_size"] = model["transform"].get("input_size")
    if out.get("pooling") == "model" and "family" not in model:
        del out["pooling"]  # older records named timm's pooled output "model", whatever it was
    if "precision" in meta:
        out["precision"] = meta["precision"]
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``fact: a vs b`` for each fact both recipes hold and disagree on."""
    return [f"{k}: {a[k]} vs {b[k]}" for k in a if k in b and a[k] != b[k]]
