"""embed: a streaming GPU embedder writing foundation-model features into tilestore stores.

>>> from embed import Options, embed
>>> report = embed(["stores/a.ome.zarr"], "uni", options=Options(compile=True))
>>> with Embedder("uni") as embedder:          # one model load for many runs
...     embedder.embed(stores_a); embedder.embed(stores_b)
>>> embed_cohort(stores, "uni", dask_client)   # many GPUs and nodes, through Dask

Members load on first use: the decoder worker processes import this package and must not
pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_MEMBERS = {
    "CohortReport": "embed.cohort",
    "embed_cohort": "embed.cohort",
    "Embedder": "embed.engine",
    "embed": "embed.engine",
    "Slice": "embed.jobs",
    "LoadedModel": "embed.models",
    "ModelError": "embed.models",
    "get_model": "embed.models",
    "list_models": "embed.models",
    "load_model": "embed.models",
    "RunReport": "embed.report",
    "Options": "embed.settings",
    "Settings": "embed.settings",
    "resolve": "embed.settings",
}

__all__ = [
    "CohortReport",
    "Embedder",
    "LoadedModel",
    "ModelError",
    "Options",
    "RunReport",
    "Settings",
    "Slice",
    "embed",
    "embed_cohort",
    "get_model",
    "list_models",
    "load_model",
    "resolve",
]


def __getattr__(name: str):
    if name in _MEMBERS:
        return getattr(importlib.import_module(_MEMBERS[name]), name)
    raise AttributeError(f"module 'embed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see
    from embed.cohort import CohortReport, embed_cohort
    from embed.engine import Embedder, embed
    from embed.jobs import Slice
    from embed.models import LoadedModel, ModelError, get_model, list_models, load_model
    from embed.report import RunReport
    from embed.settings import Options, Settings, resolve
