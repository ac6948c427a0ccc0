"""The registered tile encoders, by name (`tilestore.embed.models.catalogue` holds their facts).

Besides the named entries: ``timm:<arch>`` (a timm architecture with timm's pretrained
weights, from the HF cache: `tilestore models pull timm:<arch>` fetches them; refused
without them, never random in silence), ``local:<dir>`` (a timm-format folder) and
``random:<name>`` (random weights asked for on purpose, drawn with a fixed seed: a
registered encoder's architecture and transform, or a timm architecture; to size a GPU
with `tilestore models profile` before its weights are fetched, and for benchmarks).
"""

from __future__ import annotations

from dataclasses import replace

from tilestore.embed.models.catalogue import ENTRIES
from tilestore.embed.models.spec import Arch, ModelSpec
from tilestore.errors import ModelError

REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in ENTRIES}


def get_model(name: str) -> ModelSpec:
    """Return the spec of a registered model, a ``timm:<arch>``, a ``local:<dir>`` or a
    ``random:<registered name or timm architecture>``."""
    if name in REGISTRY:
        return REGISTRY[name]
    if name.startswith("timm:"):
        arch = _timm_arch(name)
        return ModelSpec(name, "timm", arch, None, None, data={"crop_pct": 1.0})
    if name.startswith("random:"):
        what = name.split(":", 1)[1]
        if what in REGISTRY:
            return replace(REGISTRY[what], name=name, source="random")
        arch = _timm_arch(name)  # a timm architecture, as timm:<arch> reads it
        return ModelSpec(name, "random", arch, None, None, data={"crop_pct": 1.0},
                         arch=Arch("timm", arch))  # fmt: skip
    if name.startswith("local:"):
        return ModelSpec(name, "local", name.split(":", 1)[1], None, None, data={"crop_pct": 1.0})
    raise ModelError(
        f"unknown model {name!r}; choose one of {', '.join(REGISTRY)}, "
        "timm:<architecture>, local:<folder> or random:<registered name or timm architecture>"
    )


def model_record(model: str | ModelSpec) -> ModelSpec:
    """The one record a run passes along: `model` itself where it is resolved already (a
    `ModelSpec`), else the name resolved (`get_model`), once per process: the command, the
    engine, the checks before a run and the Dask workers all take the record."""
    return model if isinstance(model, ModelSpec) else get_model(model)


def _timm_arch(name: str) -> str:
    """The timm architecture `name` names after its prefix; ModelError where timm has none."""
    import timm  # here: a registered name is looked up without torch (checks before a run)

    arch = name.split(":", 1)[1]
    if not timm.is_model(arch):
        raise ModelError(f"{name}: timm has no architecture {arch!r}")
    return arch


def timm_weights_repo(arch: str) -> str | None:
    """The Hub repo of timm's default pretrained weights of an architecture (None: timm
    publishes none for it)."""
    import timm

    cfg = timm.models.get_pretrained_cfg(arch)
    return getattr(cfg, "hf_hub_id", None) or None


def list_models() -> list[ModelSpec]:
    return list(REGISTRY.values())
