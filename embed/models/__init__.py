"""Tile encoders: a registry of facts (`ModelSpec`), their loading, and their transforms.

>>> get_model("uni")                       # the facts: hub repo, input size, pooling, mpp
>>> loaded = load_model("uni", token=...)  # module, transform, output size, weights origin
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

# loaded on first use: the facts (`get_model`) without torch, for the checks before a run
__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.embed.models.hub": ("is_cached", "pull"),
        "tilestore.embed.models.load": ("LoadedModel", "load_model"),
        "tilestore.embed.models.registry": ("REGISTRY", "get_model", "list_models", "model_record"),
        "tilestore.embed.models.spec": ("ModelSpec",),
        "tilestore.errors": ("ModelError",),
    },
)

if TYPE_CHECKING:
    from tilestore.embed.models.hub import is_cached, pull
    from tilestore.embed.models.load import LoadedModel, load_model
    from tilestore.embed.models.registry import REGISTRY, get_model, list_models, model_record
    from tilestore.embed.models.spec import ModelSpec
    from tilestore.errors import ModelError
