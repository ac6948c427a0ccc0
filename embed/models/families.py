"""Builders of tile-encoder backbones, by family, and how each family's published weights
map onto them.

A family builds the backbone from a spec's `Arch` (and the checkpoint's config.json where
the family reads one), without weights: on the meta device for the tests, on the target
device for loading. Its ``convert`` turns the state dict as the authors published it into
the backbone's key names; loading is then strict (`tilestore.embed.models.load`).

- ``timm``: a timm architecture with the model card's arguments.
- ``transformers``: a Hugging Face class that needs no remote code (ViT, DINOv2, CLIP's
  and SigLIP's vision towers), configured by the checkpoint's config.json (the spec's copy
  of it where there is no checkpoint).
- ``ctranspath``: timm's Swin-T with CTransPath's convolutional stem (`tilestore.embed.models.zoo`).
- ``conch``: a timm ViT trunk with CONCH's attentional pooler (`tilestore.embed.models.zoo`).
- ``isight``: transformers' CLIP vision tower and iSight's token map (`tilestore.embed.models.zoo`).
- ``genbio``: GenBio-PathFM's per-channel rotary ViT (`tilestore.embed.models.genbio`).
- ``keep``: KEEP's image tower, timm's ViT-L/16 and the authors' projection head
  (`tilestore.embed.models.keep`), its config.json (KEEP's own) read for the head's width.
- ``musk``: MUSK's vision path, timm's ViT-L/16 with sub-LayerNorms, read at several scales
  (`tilestore.embed.models.musk`); the whole image-text checkpoint's image half.
- ``open_clip``: open_clip's CLIP image tower (QuiltNet, BiomedCLIP; OmiCLIP's CoCa),
  configured by the checkpoint's open_clip_config.json (``model_cfg``, as open_clip's own
  Hub loading reads it), else the registry's copy of it, else open_clip's built-in config
  of the spec's architecture; its output is the image embedding ``encode_image`` gives
  (a CoCa's unit length, as its default); a training run's checkpoint is read as open_clip
  reads it (the state dict under ``state_dict``, ``module.`` taken off). The image tower
  alone is built: a text tower that is a Hugging Face model (BiomedCLIP's BERT) needs a
  second repo's config, which zero-shot fetches (`tilestore.embed.models.text`) and
  embedding does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import timm
import torch
from torch import nn

from tilestore.embed.models import genbio, keep, musk, zoo
from tilestore.embed.models.spec import ModelSpec
from tilestore.embed.models.statekeys import Qkv, State, renamed
from tilestore.errors import ModelError


@dataclass(frozen=True)
class Family:
    """build(spec, config) -> backbone; convert(spec, state, backbone) -> the backbone's keys;
    config: whether a checkpoint folder has a config.json ("timm" or "transformers" format)
    or none; load: where the family's library loads its own checkpoints (transformers, whose
    modules' key names are not those of the files it writes), (spec, folder, weights file,
    config) -> backbone with its weights, instead of build + convert + our strict load."""

    build: Callable[[ModelSpec, dict | None], nn.Module]
    convert: Callable[[ModelSpec, State, nn.Module], State] = lambda spec, state, backbone: state
    config: str | None = None
    load: Callable[..., nn.Module] | None = None


# -- timm ------------------------------------------------------------------------------------

_LAYERS = {"SwiGLUPacked": timm.layers.SwiGLUPacked}


def _timm_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A spec's timm arguments with the layer names it gives as strings made classes."""
    out = dict(kwargs)
    if isinstance(out.get("mlp_layer"), str):
        out["mlp_layer"] = _LAYERS[out["mlp_layer"]]
    return out


def _build_timm(spec: ModelSpec, config: dict | None) -> nn.Module:
    config = config or {}
    name = spec.arch.name if spec.arch else config.get("architecture")
    if not name:
        raise ModelError(f"{spec.name}: no architecture (config.json has no 'architecture')")
    kwargs = {
        **config.get("model_args", {}),
        **_timm_kwargs(spec.arch.kwargs if spec.arch else {}),
        "num_classes": 0,
    }
    if spec.pooling != "model":
        kwargs["global_pool"] = ""
    try:
        model = timm.create_model(
            name, pretrained=False, pretrained_cfg=config.get("pretrained_cfg"), **kwargs
        )
    except (RuntimeError, TypeError, ValueError, KeyError) as exc:
        raise ModelError(f"{spec.name}: cannot build {name}: {exc}") from exc
    made_as_released(spec, model)
    return model


def made_as_released(spec: ModelSpec, model: nn.Module) -> None:
    """The state an architecture computes at build (its non-persistent buffers), made as
    the authors' release holds it where that differs (`Arch.periods`): after a build, and
    after those buffers are made again on a model whose weights were assigned."""
    if spec.arch and spec.arch.periods is not None:
        _PERIODS[spec.arch.periods](spec, model)


def _bf16_periods(spec: ModelSpec, model: nn.Module) -> None:
    """The rotary periods as DINOv3's release holds them: a persistent bfloat16 buffer,
    read into float32 by the authors' model. timm computes them in float32 and keeps them
    out of its state dict: features then differ from the authors' (random weights: 4.1e-03
    for the ViT-H+, 1.7e-02 for two blocks of the ViT-7B; bench/dinov3_periods.py,
    bench/RESULTS.md), and are the same bit for bit once rounded."""
    ropes = [m for m in model.modules() if isinstance(m, timm.layers.RotaryEmbeddingDinoV3)]
    if not ropes:
        raise ModelError(f"{spec.name}: {spec.arch.name} has no DINOv3 rotary embedding")
    with torch.no_grad():
        for rope in ropes:
            rope.periods.copy_(rope.periods.to(torch.bfloat16).to(rope.periods.dtype))
            if rope.feat_shape is not None and not rope.periods.is_meta:
                rope._cache_embed(list(rope.feat_shape))  # a fixed size's table, made again


# an Arch's ``periods``: how the rotary periods are made as the authors' release holds them
_PERIODS = {"bf16": _bf16_periods}


# transformers' DINOv2 (with registers) key names -> DINOv2's own (per block: the rest of the
# key after ``encoder.layer.N.``)
_HF_DINOV2_BLOCK = {
    "norm1.": "norm1.",
    "norm2.": "norm2.",
    "attention.output.dense.": "attn.proj.",
    "layer_scale1.lambda1": "ls1.gamma",
    "layer_scale2.lambda1": "ls2.gamma",
    "mlp.fc1.": "mlp.fc1.",
    "mlp.fc2.": "mlp.fc2.",
    "mlp.weights_in.": "mlp.w12.",
    "mlp.weights_out.": "mlp.w3.",
}
_HF_DINOV2_TOP = {
    "embeddings.cls_token": "cls_token",
    "embeddings.mask_token": "mask_token",
    "embeddings.register_tokens": "register_tokens",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.": "patch_embed.proj.",
    "layernorm.": "norm.",
}


def _hf_dinov2_to_dinov2(state: State) -> State:
    """transformers' DINOv2 layout (``embeddings.*``, ``encoder.layer.N.*``, separate query,
    key and value) in DINOv2's own: the same tensors, the attention's three projections
    stacked into one ``qkv`` as DINOv2 keeps them. A key neither names is kept as it is
    (and fails the strict load)."""
    state = {k.removeprefix("dinov2."): v for k, v in state.items()}
    out: State = {}
    qkv = Qkv(("query", "key", "value"), "the checkpoint")
    for key, value in state.items():
        block = re.match(r"^encoder\.layer\.(\d+)\.(.*)$", key)
        if block:
            index, rest = block.groups()
            part = re.match(r"^attention\.attention\.(query|key|value)\.(weight|bias)$", rest)
            if part:
                qkv.add(f"blocks.{index}.attn.qkv.{part[2]}", part[1], value)
                continue
            new = renamed(rest, _HF_DINOV2_BLOCK, f"blocks.{index}.") or key
        else:
            new = renamed(key, _HF_DINOV2_TOP) or key
        out[new] = value
    return out | qkv.stacked()


def _from_dinov2(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    """DINOv2's own layout (torch.hub facebookresearch/dinov2), or transformers' (first put
    in DINOv2's: a Hub repo for transformers' code), into timm's: registers as
    ``reg_token``, the class token's position folded into the token (timm's registers
    models place no position on prefix tokens), SwiGLU's ``w12``/``w3`` as ``fc1``/``fc2``.
    No position table is resampled: a table of another size fails to load."""
    if any(k.startswith(("embeddings.", "dinov2.embeddings.")) for k in state):
        state = _hf_dinov2_to_dinov2(state)
    state = {k: v for k, v in state.items() if k != "mask_token"}
    if "register_tokens" in state:
        state["reg_token"] = state.pop("register_tokens")
        state["cls_token"] = state["cls_token"] + state["pos_embed"][:, :1]
        state["pos_embed"] = state["pos_embed"][:, 1:]
    return {
        re.sub(
            r"^(blocks\.\d+\.mlp)\.w12\.",
            r"\1.fc1.",
            re.sub(r"^(blocks\.\d+\.mlp)\.w3\.", r"\1.fc2.", k),
        ): v
        for k, v in state.items()
    }


def _from_dinov2_teacher(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    """A DINOv2 training checkpoint (DinoBloom's): its teacher's backbone, in DINOv2's own
    layout ({"teacher": {"backbone.<name>": ...}}, read flat as "teacher.backbone.<name>"),
    its heads (DINO's, iBOT's) and anything else left out; then as `_from_dinov2`."""
    prefix = "teacher.backbone."
    if not any(k.startswith(prefix) for k in state):
        raise ModelError(f"{spec.name}: the checkpoint holds no teacher backbone ({prefix}*)")
    kept = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    return _from_dinov2(spec, kept, backbone)


# an Arch's ``convert``: the layout its published weights are in
_TIMM_CONVERT = {"dinov2": _from_dinov2, "dinov2_teacher": _from_dinov2_teacher}


def _timm_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    convert = spec.arch.convert if spec.arch else None
    return _TIMM_CONVERT[convert](spec, state, backbone) if convert else state


# -- transformers ----------------------------------------------------------------------------

# class -> (config class, prefix tokens beyond the class token, the state dict prefixes a
# published checkpoint may put before the class's own keys)
_HF_CLASSES = {
    "ViTModel": ("ViTConfig", ("vit.",)),
    "Dinov2Model": ("Dinov2Config", ("dinov2.",)),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", ()),
    "SiglipVisionModel": ("SiglipVisionConfig", ()),
}
# classes whose tokens have no class token in front (SigLIP pools with its own head)
_HF_NO_PREFIX = ("SiglipVisionModel",)


class HFTokens(nn.Module):
    """A transformers vision model as a backbone: its last hidden state as the tokens."""

    def __init__(self, model: nn.Module, num_prefix_tokens: int = 1):
        super().__init__()
        self.model = model
        self.num_prefix_tokens = num_prefix_tokens

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        inner = getattr(self.model, "vision_model", self.model)
        return inner(pixel_values=x).last_hidden_state

    def project(self, cls: torch.Tensor) -> torch.Tensor:
        """CLIP's image embedding of its class token: the post-norm, then the projection."""
        return self.model.visual_projection(self.model.vision_model.post_layernorm(cls))

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """SigLIP's image embedding: its attentional head (one learned probe) over the
        post-normed tokens, which are its last hidden state."""
        return getattr(self.model, "vision_model", self.model).head(tokens)


def _hf_config(spec: ModelSpec, config: dict | None):
    try:
        import transformers
    except ImportError as exc:
        raise ModelError(f"{spec.name}: needs transformers: pip install 'tilestore[hf]'") from exc
    class_name = spec.arch.name
    settings = dict(config or spec.arch.kwargs)
    if class_name.startswith("CLIP") and "vision_config" in settings:  # a whole CLIPModel's
        settings = {**settings["vision_config"], "projection_dim": settings["projection_dim"]}
    elif "vision_config" in settings:  # a whole SiglipModel's
        settings = dict(settings["vision_config"])
    for key in ("architectures", "auto_map", "transformers_version", "torch_dtype", "dtype"):
        settings.pop(key, None)
    hf_config = getattr(transformers, _HF_CLASSES[class_name][0])(**settings)
    kwargs = {"add_pooling_layer": False} if class_name == "ViTModel" else {}
    prefix = 0 if class_name in _HF_NO_PREFIX else 1 + int(settings.get("num_register_tokens", 0))
    return getattr(transformers, class_name), hf_config, kwargs, prefix


def _build_transformers(spec: ModelSpec, config: dict | None) -> nn.Module:
    model_class, hf_config, kwargs, prefix = _hf_config(spec, config)
    hf_config._attn_implementation = "sdpa"
    return HFTokens(model_class(hf_config, **kwargs), prefix)


# keys a checkpoint may hold that the vision model does not use: ViT's pooler (the class
# token is taken), a whole CLIP's text tower and temperature
_HF_UNUSED = ("pooler.", "text_model.", "text_projection.", "logit_scale", "logit_bias")


def _load_transformers(spec: ModelSpec, folder, weights, config: dict | None) -> nn.Module:
    """transformers' own from_pretrained (it maps the files' key names onto its modules),
    made strict: a missing, unexpected or misshapen tensor stops loading with one line."""
    model_class, hf_config, kwargs, prefix = _hf_config(spec, config)
    model, info = model_class.from_pretrained(
        folder,
        config=hf_config,
        local_files_only=True,
        output_loading_info=True,
        attn_implementation="sdpa",
        dtype=torch.float32,
        **kwargs,
    )
    unused = _HF_UNUSED + tuple(p + u for p in ("vit.", "dinov2.") for u in _HF_UNUSED)
    unexpected = [k for k in info.get("unexpected_keys", ()) if not k.startswith(unused)]
    missing, mismatched = list(info.get("missing_keys", ())), list(info.get("mismatched_keys", ()))
    if missing or unexpected or mismatched:
        raise ModelError(
            f"{spec.name}: weights do not fit the architecture: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}, misshapen {mismatched[:3]}"
        )
    return HFTokens(model, prefix)


# -- own builds ------------------------------------------------------------------------------


def _build_ctranspath(spec: ModelSpec, config: dict | None) -> nn.Module:
    return zoo.ctranspath(**spec.arch.kwargs)


def _ctranspath_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    """The authors' checkpoint (their timm 0.5 Swin's) into timm's Swin: timm's own filter
    moves each stage's downsampling to the start of the next stage and drops the buffers it
    computes itself."""
    from timm.models.swin_transformer import checkpoint_filter_fn

    return checkpoint_filter_fn(state, backbone)


def _build_conch(spec: ModelSpec, config: dict | None) -> nn.Module:
    return zoo.conch(spec.arch.name, **spec.arch.kwargs, projection=spec.projection is not None)


def _conch_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    return zoo.conch_state(spec.arch.name, state, backbone)


def _build_isight(spec: ModelSpec, config: dict | None) -> nn.Module:
    return zoo.ISight(**spec.arch.kwargs)


def _isight_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    return zoo.isight_state(state)


def _build_genbio(spec: ModelSpec, config: dict | None) -> nn.Module:
    return genbio.genbio_pathfm(**spec.arch.kwargs)


def _build_keep(spec: ModelSpec, config: dict | None) -> nn.Module:
    """KEEP's image tower; the joint space's width is its config.json's ``projection_dim``
    (the authors' head reads it there), the ViT's arguments are those their code hardcodes."""
    width = (config or {}).get("projection_dim", keep.PROJECTION_DIM)
    return keep.KeepImage(spec.arch.name, width, **spec.arch.kwargs)


def _keep_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    return keep.keep_state(state)


def _build_musk(spec: ModelSpec, config: dict | None) -> nn.Module:
    return musk.musk(**spec.arch.kwargs)


def _musk_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    return musk.musk_state(state)


def open_clip_config(spec: ModelSpec, config: dict | None) -> dict:
    """The model_cfg an open_clip CLIP is built from: the checkpoint's (its
    open_clip_config.json's), else the registry's copy of it (the spec's arguments, where
    open_clip has no config of that name: BiomedCLIP's), else open_clip's own for the
    spec's architecture."""
    try:
        import open_clip
    except ImportError as exc:
        raise ModelError(
            f"{spec.name}: needs open_clip: pip install 'tilestore[openclip]'"
        ) from exc
    found = (
        (config or {}).get("model_cfg")
        or spec.arch.kwargs
        or open_clip.get_model_config(spec.arch.name)
    )
    if not found:
        raise ModelError(
            f"{spec.name}: no open_clip_config.json with a model_cfg beside its weights, and "
            f"open_clip has no architecture {spec.arch.name!r}: `tilestore models pull "
            f"{spec.name}` fetches the repo's"
        )
    return dict(found)


def open_clip_text_repos(config: dict) -> tuple[str, ...]:
    """The Hub repos an open_clip text tower that is a Hugging Face model is built from (its
    config's ``hf_model_name``, its tokenizer's ``hf_tokenizer_name``: BiomedCLIP's BERT);
    none for open_clip's own text transformer."""
    text = config.get("text_cfg", {})
    names = (text.get("hf_model_name"), text.get("hf_tokenizer_name"))
    return tuple(dict.fromkeys(n for n in names if n))


class OpenClipImage(nn.Module):
    """open_clip's CLIP image tower as a backbone: ``forward`` is its image embedding, as
    the model's ``encode_image`` gives it by default: a CLIP's as it is; a CoCa's (OmiCLIP)
    the attentional pooler's contrastive query (its tower also returns the tokens its text
    decoder reads), made unit length, as CoCa's ``encode_image(normalize=True)``."""

    def __init__(self, visual: nn.Module, unit: bool = False):
        super().__init__()
        self.visual, self.unit = visual, unit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.visual(x)
        if isinstance(out, tuple):  # (pooled, tokens): a tower with output_tokens
            out = out[0]
        return nn.functional.normalize(out, dim=-1) if self.unit else out


def is_coca(config: dict) -> bool:
    """An open_clip config of a CoCa (a text decoder over the image tokens): open_clip
    builds it as its CoCa class."""
    return "multimodal_cfg" in config


def _build_open_clip(spec: ModelSpec, config: dict | None) -> nn.Module:
    """The image tower as open_clip's CLIP, CustomTextCLIP and CoCa build theirs (``visual``),
    without their text tower."""
    import open_clip

    found = open_clip_config(spec, config)
    visual = open_clip.model._build_vision_tower(
        found["embed_dim"], found["vision_cfg"], found.get("quick_gelu", False)
    )
    return OpenClipImage(visual, unit=is_coca(found))


def open_clip_state(state: State) -> State:
    """An open_clip checkpoint's state dict as its model names it: a training run's saved
    through DistributedDataParallel has every key under ``module.``, which open_clip's
    ``load_checkpoint`` takes off."""
    if state and all(k.startswith("module.") for k in state):
        return {k.removeprefix("module."): v for k, v in state.items()}
    return state


def _open_clip_convert(spec: ModelSpec, state: State, backbone: nn.Module) -> State:
    """The whole CLIP checkpoint's image tower (``visual.*``), as our module names it."""
    return {k: v for k, v in open_clip_state(state).items() if k.startswith("visual.")}


FAMILIES: dict[str, Family] = {
    "timm": Family(_build_timm, _timm_convert, "timm"),
    "transformers": Family(_build_transformers, config="transformers", load=_load_transformers),
    "ctranspath": Family(_build_ctranspath, _ctranspath_convert),
    "conch": Family(_build_conch, _conch_convert),
    "isight": Family(_build_isight, _isight_convert),
    "genbio": Family(_build_genbio),
    "keep": Family(_build_keep, _keep_convert, "keep"),
    "open_clip": Family(_build_open_clip, _open_clip_convert, "open_clip"),
    "musk": Family(_build_musk, _musk_convert),
}


def family(spec: ModelSpec) -> Family:
    return FAMILIES[spec.family]


def build(spec: ModelSpec, config: dict | None = None) -> nn.Module:
    """The spec's backbone without weights (on the current default device)."""
    return family(spec).build(spec, config)
