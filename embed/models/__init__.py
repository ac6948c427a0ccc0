"""Tile encoders: a registry of facts (`ModelSpec`), their loading, and their transforms.

>>> get_model("uni")                       # the facts: hub repo, input size, pooling, mpp
>>> loaded = load_model("uni", token=...)  # module, transform, output size, weights origin
"""

from tilestore.embed.models.hub import is_cached, pull
from tilestore.embed.models.load import LoadedModel, load_model
from tilestore.embed.models.registry import REGISTRY, get_model, list_models
from tilestore.embed.models.spec import ModelError, ModelSpec

__all__ = [
    "REGISTRY",
    "LoadedModel",
    "ModelError",
    "ModelSpec",
    "get_model",
    "is_cached",
    "list_models",
    "load_model",
    "pull",
]
