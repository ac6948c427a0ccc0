"""The registered tile encoders, by name (`tilestore.embed.models.catalogue` holds their facts).

Besides the named entries: ``timm:<arch>`` (random weights unless the timm weights are in
the HF cache; for benchmarks), ``local:<dir>`` (a timm-format folder) and ``random:<name>``
(a registered encoder's architecture and transform with random weights: to size a GPU
with `tilestore models profile` before its weights are fetched, and for benchmarks).
"""

from __future__ import annotations

from dataclasses import replace

from tilestore.embed.models.catalogue import ENTRIES
from tilestore.embed.models.spec import ModelSpec
from tilestore.errors import ModelError

REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in ENTRIES}


def get_model(name: str) -> ModelSpec:
    """Return the spec of a registered model, a ``timm:<arch>`` or a ``local:<dir>``."""
    if name in REGISTRY:
        return REGISTRY[name]
    if name.startswith("timm:"):
        import timm  # here: a registered name is looked up without torch (checks before a run)

        arch = name.split(":", 1)[1]
        if not timm.is_model(arch):
            raise ModelError(f"{name}: timm has no architecture {arch!r}")
        return ModelSpec(name, "timm", arch, None, None, data={"crop_pct": 1.0})
    if name.startswith("random:") and name.split(":", 1)[1] in REGISTRY:
        return replace(REGISTRY[name.split(":", 1)[1]], name=name, source="random")
    if name.startswith("local:"):
        return ModelSpec(name, "local", name.split(":", 1)[1], None, None, data={"crop_pct": 1.0})
    raise ModelError(
        f"unknown model {name!r}; choose one of {', '.join(REGISTRY)}, "
        "timm:<architecture>, local:<folder> or random:<registered name>"
    )


def list_models() -> list[ModelSpec]:
    return list(REGISTRY.values())
