"""Loading a slide encoder: its module built by its builder, its authors' weights fetched
ourselves (`tilestore.embed.models.hub`: safetensors, or torch files with weights_only),
mapped from the authors' layout onto ours and loaded strictly: every tensor the module has
must come from the checkpoint, or loading stops with one line."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tilestore.embed.models import hub
from tilestore.embed.slides.nets import BUILDERS
from tilestore.embed.slides.registry import get_slide_encoder
from tilestore.embed.slides.spec import SlideSpec
from tilestore.embeddings.slides import TileFeatures
from tilestore.errors import SlideEncoderError

AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def build(spec: SlideSpec, in_dim: int | None = None) -> nn.Module:
    """The encoder's module without weights (on the current default device: the meta
    device builds it for free). in_dim: the tile features' width, for pooling encoders."""
    kwargs = dict(spec.kwargs)
    if "in_dim" not in kwargs:
        kwargs["in_dim"] = in_dim
    return BUILDERS[spec.arch](**kwargs)


@dataclass
class LoadedSlideEncoder:
    """A slide encoder ready to run: module, where its weights came from."""

    spec: SlideSpec
    module: nn.Module
    weights: str
    revision: str | None

    @property
    def in_dim(self) -> int | None:
        return self.module.in_dim

    def describe(self, precision: str) -> dict[str, Any]:
        """What a slide embedding records of the encoder that made it."""
        return {
            "encoder": self.spec.name,
            "arch": self.spec.arch,
            "settings": {k: v for k, v in self.spec.kwargs.items() if k != "in_dim"},
            "repo": self.spec.repo or None,
            "revision": self.revision,
            "weights": self.weights,
            "precision": precision,
            "licence": self.spec.licence,
        }

    @torch.inference_mode()
    def encode(
        self,
        tiles: TileFeatures,
        device: torch.device,
        precision: str,
        guide: TileFeatures | None = None,
    ) -> np.ndarray:
        """One slide's embedding from its tile features (float32 numpy); guide: the spec's
        guide model's features of the same tiles, where it names one."""
        features = torch.from_numpy(np.asarray(tiles.features, dtype=np.float32)).to(device)
        cells = torch.from_numpy(np.stack([tiles.col, tiles.row], axis=1)).to(device)
        extra = {}
        if guide is not None:
            extra["guide"] = torch.from_numpy(np.asarray(guide.features, np.float32)).to(device)
        dtype = AUTOCAST.get(precision)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = self.module(features, cells, **extra)
        return out.float().cpu().numpy()


def load_slide_encoder(
    name: str | SlideSpec,
    *,
    in_dim: int | None = None,
    token: str | None = None,
    weights: str | os.PathLike | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> LoadedSlideEncoder:
    """Return the encoder with its weights, in eval mode on `device`.

    weights: a local copy of the encoder's weights file (required where its source is
    "file": CHIEF's are not on the Hub); random:<name> draws random weights from `seed`."""
    spec = name if isinstance(name, SlideSpec) else get_slide_encoder(name)
    with torch.device("meta"):
        module = build(spec, in_dim)
    revision, origin = None, "none"
    if weights is not None or spec.source in ("hf-hub", "file"):
        state, revision, origin = _checkpoint(spec, weights, token)
        module = module.to_empty(device=device)
        _load(spec, module, CONVERT.get(spec.arch, _same)(state))
    else:
        module = module.to_empty(device=device)
        if spec.source == "random":
            randomise(module, seed)
            origin = f"random (seed {seed})"
    _fill_buffers(module, spec, in_dim)
    return LoadedSlideEncoder(spec, module.to(device).eval(), origin, revision)


def _fill_buffers(module: nn.Module, spec: SlideSpec, in_dim: int | None) -> None:
    """Buffers that are not weights (ALiBi slopes) come from a fresh CPU build."""
    fresh = dict(build(spec, in_dim).named_buffers())
    for name, buffer in module.named_buffers():
        buffer.copy_(fresh[name])


def randomise(module: nn.Module, seed: int) -> None:
    """Random weights of a trained encoder's scale (benchmarks, the reference check):
    layer norms' scales near 1, every other tensor N(0, 0.02)."""
    generator = torch.Generator().manual_seed(seed)
    norms = {f"{name}.weight" for name, m in module.named_modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in module.named_parameters():
            values = torch.randn(p.shape, generator=generator) * 0.02
            p.copy_(values + 1 if name in norms else values)


def _checkpoint(spec: SlideSpec, weights, token) -> tuple[dict, str | None, str]:
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise SlideEncoderError(f"{spec.name}: no weights file {path}")
        return hub.load_weights(spec.name, path), None, str(path)
    if spec.source == "file":
        raise SlideEncoderError(
            f"{spec.name}: its weights are not on the Hugging Face Hub: download "
            f"{spec.weights_file} as {spec.card} says and pass --slide-weights <file>"
        )
    found = hub.fetch(spec.name, spec.repo, token=token, config=None, weights=(spec.weights_file,))
    return hub.load_weights(spec.name, found.weights), found.revision, f"{spec.repo}"


def _load(spec: SlideSpec, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    try:
        result = module.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if "size mismatch" in ln), exc)
        raise SlideEncoderError(
            f"{spec.name}: weights do not fit the architecture ({first})"
        ) from exc
    if result.missing_keys or result.unexpected_keys:
        raise SlideEncoderError(
            f"{spec.name}: weights do not fit the architecture: missing "
            f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}"
        )


# -- the authors' layouts onto ours ------------------------------------------------------


def _same(state: dict) -> dict:
    return state


def _renamed(rules: list[tuple[str, str]], drop: tuple[str, ...] = ()) -> Callable[[dict], dict]:
    """A converter: keys matching `drop` go, the first rule (regex, replacement) matching a
    key renames it, keys no rule matches go (the parts of a checkpoint a slide embedding
    does not use: classifiers, text towers). The first key renamed to a name wins (the
    authors' shared layers are saved under each of their names, or under one)."""

    def convert(state: dict) -> dict:
        out: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            if key.startswith(drop):
                continue
            for pattern, replacement in rules:
                if re.fullmatch(pattern, key):
                    out.setdefault(re.sub(pattern, replacement, key), value)
                    break
        return out

    return convert


def _prism_layer(match: re.Match) -> str:
    layer, kind, rest = int(match.group(1)), match.group(2), match.group(3)
    if kind == "tf":  # every layer reuses layer 0's blocks
        return f"tf.{rest}"
    return f"cross.{min(layer, 1)}.{rest}"  # layers 2-7 reuse layer 1's cross-attention


def _prism(state: dict) -> dict:
    out: dict[str, torch.Tensor] = {}
    layers = re.compile(r"image_resampler\.perceiver\.layers\.(\d+)\.(xattn|tf)\.(.*)")
    for key, value in sorted(state.items(), key=lambda kv: _layer_order(kv[0])):
        found = layers.fullmatch(key)
        if found:
            out.setdefault(_prism_layer(found), value)
        elif key == "image_resampler.perceiver.latents":
            out["latents"] = value
        elif key.startswith("image_resampler.cls_norm."):
            out[key.removeprefix("image_resampler.")] = value
    return out


def _layer_order(key: str) -> tuple[int, str]:
    found = re.search(r"layers\.(\d+)\.", key)
    return (int(found.group(1)) if found else -1, key)


def _moozy(state: dict) -> dict:
    """MOOZY's checkpoint (its slide encoder and case transformer, flattened by
    `hub.load_weights`) as it is, less the ALiBi slopes it saves under each block's name:
    ours are computed, and a checkpoint whose slopes are not those (learned ones) is
    refused rather than run with other slopes."""
    from tilestore.embed.slides.nets.titan import alibi_slopes

    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith("pos_bias.slopes"):
            expected = -torch.tensor(alibi_slopes(value.numel()), dtype=value.dtype)
            if not torch.allclose(value.reshape(-1).cpu(), expected, atol=1e-6):
                raise SlideEncoderError(
                    f"moozy: {key} holds ALiBi slopes other than the fixed ones "
                    "(a checkpoint with learned slopes); this architecture computes them"
                )
        elif key.startswith(("teacher_slide_encoder.", "case_transformer.")):
            out[key] = value
    return out


def _cobra(state: dict) -> dict:
    """COBRA's training checkpoint (its MoCo model's state dict, under DDP's ``module.``):
    the momentum encoder, as the authors' ``get_cobraII`` takes it, less its contrastive
    projection and the LayerNorm its Mamba encoder builds and never uses; a checkpoint of
    the bare model (no momentum encoder) as it is, less that LayerNorm."""
    inner = re.compile(r"(?:.*\.)?momentum_enc\.(.*)")
    found = {m.group(1): v for k, v in state.items() if (m := inner.fullmatch(k))}
    return {
        k: v for k, v in (found or state).items() if not k.startswith(("proj.", "mamba_enc.norm."))
    }


# CHIEF's attention layers, named as in its checkpoint (the rest: its classifiers, text)
_chief_attention = _renamed([(r"attention_net\.(.*)", r"attention_net.\1")])

CONVERT: dict[str, Callable[[dict], dict]] = {
    "feather": _renamed([(r"model\.(patch_embed|global_attn)\.(.*)", r"\1.\2")]),
    "madeleine": _renamed(
        [
            (r"(?:module\.)?wsi_embedders\.(pre_attn|attn)\.(.*)", r"\1.\2"),
            (r"(?:module\.)?projector\.(.*)", r"projector.\1"),
        ]
    ),
    "chief": _chief_attention,
    "eagle": _chief_attention,  # CHIEF's checkpoint, as EAGLE uses it
    "titan": _renamed(
        [
            (r"vision_encoder\.blocks\.modules_list\.(.*)", r"blocks.\1"),
            (
                r"vision_encoder\.(patch_embed|cls_token|norm|attn_pool_contrastive)(.*)",
                r"\1\2",
            ),
        ]
    ),
    "prism": _prism,
    "moozy": _moozy,
    "cobra": _cobra,
    "longnet": _renamed(
        [(r"(patch_embed|cls_token|encoder\.layers|norm)(.*)", r"\1\2")],
        drop=("encoder.layer_norm",),
    ),
}


def slide_is_cached(spec: SlideSpec) -> bool:
    """Whether the encoder loads without a download (its weights are in the HF cache, or it
    has none, or they come from a file)."""
    if spec.source != "hf-hub":
        return True
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(spec.repo, spec.weights_file, cache_dir=hub.cache_dir())
    return isinstance(found, str)


def pull_slide_encoder(name: str, *, token: str | None = None) -> hub.Checkpoint | None:
    """Download a slide encoder's weights into the HF cache (for offline compute nodes);
    None where it has none on the Hub."""
    spec = get_slide_encoder(name)
    if spec.source != "hf-hub":
        return None
    if hub.offline():
        raise SlideEncoderError(f"{name}: HF_HUB_OFFLINE is set; pull on a machine with internet")
    return hub.fetch(spec.name, spec.repo, token=token, config=None, weights=(spec.weights_file,))
