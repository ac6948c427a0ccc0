"""Tile encoders: a registry of facts (`ModelSpec`), their loading, and their transforms.

>>> get_model("uni")                       # the facts: hub repo, input size, pooling, mpp
>>> loaded = load_model("uni", token=...)  # module, transform, output size, weights origin
"""

from embed.models.load import LoadedModel, load_model
from embed.models.registry import REGISTRY, get_model, list_models
from embed.models.spec import ModelError, ModelSpec

__all__ = [
    "REGISTRY",
    "LoadedModel",
    "ModelError",
    "ModelSpec",
    "get_model",
    "list_models",
    "load_model",
]
