"""The patch encoders of issue 50 (PathOrchestra, mSTAR, Digepath, Prost40M, GenBio-PathFM,
iSight, MUSK): each built small on random weights saved in the layout its authors publish,
loaded by our loader offline, and compared with the construction their code uses where it
runs here (timm's, transformers'; MUSK's forward written out on its own tensor names); the
full-size reference check is bench/encoders.py's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import timm
import torch
import torch.nn.functional as F

from tilestore.embed.models import ModelError, get_model, load_model
from tilestore.embed.models.catalogue import IMAGENET, OPENAI_CLIP, _data
from tilestore.embed.models.families import build

SMALL_VIT = {"depth": 2, "embed_dim": 64, "num_heads": 4}
TIMM_HUB = ["pathorchestra", "mstar", "digepath", "prost40m"]


def _small(spec, data=None, **kwargs):
    arch = replace(spec.arch, kwargs={**spec.arch.kwargs, **kwargs})
    return replace(spec, arch=arch, output_dim=None, data=data or spec.data)


def _local(spec, folder):
    return replace(spec, source="local", repo=str(folder))


@pytest.mark.parametrize("name", TIMM_HUB)
def test_timm_hub_encoders_load_offline_from_the_cache_as_timm_builds_them(name, hf_cache):
    """The repo as timm publishes it (config.json + model.safetensors) in an offline HF
    cache: our features are timm's own model's, built from that config as
    ``create_model("hf-hub:...")`` builds it, pooled to its class token."""
    spec = get_model(name)
    args = {**spec.arch.kwargs, **SMALL_VIT}
    _, state = hf_cache(repo=spec.repo, arch=spec.arch.name, model_args=args)
    loaded = load_model(_small(spec, **SMALL_VIT))
    assert loaded.weights.endswith("model.safetensors") and loaded.output_dim == 64
    theirs = timm.create_model(spec.arch.name, pretrained=False, num_classes=0, **args).eval()
    theirs.load_state_dict(state)
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.features(x), theirs(x))


def test_card_normalisation_over_the_config_and_prost40m_takes_its_config(hf_cache):
    """mSTAR's card normalises with ImageNet's mean and std whatever its config.json says;
    Prost40M's registry entry gives none, so its config.json's pretrained_cfg is used."""
    mstar = get_model("mstar")
    hf_cache(repo=mstar.repo, arch=mstar.arch.name, model_args={**mstar.arch.kwargs, **SMALL_VIT})
    prost = get_model("prost40m")
    hf_cache(repo=prost.repo, arch=prost.arch.name, model_args={**prost.arch.kwargs, **SMALL_VIT})
    card = load_model(_small(mstar, **SMALL_VIT)).transform.describe()
    config = load_model(_small(prost, **SMALL_VIT)).transform.describe()
    assert tuple(card["mean"]) == pytest.approx(IMAGENET[0])
    assert tuple(config["mean"]) == pytest.approx((0.5, 0.5, 0.5))  # the cache's config.json


# -- GenBio-PathFM -----------------------------------------------------------------------------

GENBIO_SMALL = {"depth": 2, "embed_dim": 64, "num_heads": 4}


def _genbio_checkpoint(folder, seed=0):
    """Random weights in the authors' model.pth layout (their VisionTransformer's keys)."""
    from tilestore.embed.models.genbio import genbio_pathfm

    torch.manual_seed(seed)
    model = genbio_pathfm(**GENBIO_SMALL)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            tensor.normal_(std=0.02 if "gamma" not in name else 0.1)
            if "norm" in name and name.endswith("weight"):
                tensor.add_(1)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pth")
    return model.eval()


def test_genbio_pathfm_loads_the_authors_layout_and_concatenates_the_channels(tmp_path):
    spec = _small(get_model("genbio-pathfm"), **GENBIO_SMALL)
    ours = _genbio_checkpoint(tmp_path / "genbio")
    loaded = load_model(_local(spec, tmp_path / "genbio"))
    assert loaded.output_dim == 3 * 64 and loaded.module.num_prefix_tokens == 5
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        features = loaded.features(x)
        # each third is that channel's class token, the channel encoded alone as a 1-channel image
        for c in range(3):
            alone = ours.encode(x[:, c : c + 1])[:, 0]
            torch.testing.assert_close(features[:, 64 * c : 64 * (c + 1)], alone)
        other = x.clone()
        other[:, 1] = torch.randn(2, 224, 224)  # another green channel: red and blue unchanged
        changed = loaded.features(other)
        torch.testing.assert_close(changed[:, :64], features[:, :64])
        torch.testing.assert_close(changed[:, 128:], features[:, 128:])
        assert not torch.allclose(changed[:, 64:128], features[:, 64:128])
        tokens = loaded.module.tokens(x)
    assert tuple(tokens.shape) == (2, 14, 14, 192)


def test_genbio_pathfm_rotary_angles_are_bf16_as_its_authors_compute_them():
    from tilestore.embed.models.genbio import Rope

    sin, cos = Rope(64, 4)(14, 14)
    assert sin.dtype == cos.dtype == torch.bfloat16 and tuple(sin.shape) == (196, 16)


def test_genbio_pathfm_without_its_rotary_periods_is_refused(tmp_path):
    _genbio_checkpoint(tmp_path / "g")
    state = torch.load(tmp_path / "g" / "model.pth", weights_only=True)
    del state["rope_embed.periods"]
    torch.save(state, tmp_path / "g" / "model.pth")
    spec = _small(get_model("genbio-pathfm"), **GENBIO_SMALL)
    with pytest.raises(ModelError, match=r"missing \['rope_embed.periods'\]"):
        load_model(_local(spec, tmp_path / "g"))


# -- iSight ----------------------------------------------------------------------------------

CLIP_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "image_size": 56, "patch_size": 14}  # fmt: skip


def _isight_checkpoint(path, transformers):
    """The authors' release: a training checkpoint whose model_state_dict is their CLAM_ViT's
    (a whole CLIPModel under ``patch_encoder.``, the token map, the attention pooler and the
    task heads), beside the optimiser's state."""
    config = transformers.CLIPConfig(
        vision_config={**CLIP_SMALL, "hidden_act": "quick_gelu"},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2},
        projection_dim=24,
    )  # fmt: skip
    clip = transformers.CLIPModel(config).eval()
    projection = torch.nn.Linear(64, 64)
    state = {f"patch_encoder.{k}": v for k, v in clip.state_dict().items()}
    state |= {f"visual_token_projection.{k}": v for k, v in projection.state_dict().items()}
    state |= {"attention_net.attention_a.0.weight": torch.randn(16, 64),
              "classifiers.0.weight": torch.randn(4, 64)}  # fmt: skip
    path.parent.mkdir(parents=True)
    torch.save({"epoch": 3, "model_state_dict": state, "optimizer_state_dict": {"state": {}},
                "test_loss": 0.5}, path)  # fmt: skip
    return clip, projection


def test_isight_is_the_mean_of_its_authors_projected_tokens(tmp_path):
    """The authors' construction: CLIPModel, its vision tower's last hidden states
    (``hidden_states[-1]``), the token map, then the mean over every token (the class token
    too): the same numbers from our loader reading their training checkpoint."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "isight" / "iSight_model_checkpoint.pth"
    clip, projection = _isight_checkpoint(path, transformers)
    small = {k: v for k, v in CLIP_SMALL.items()}
    spec = _small(get_model("isight"), data=_data(OPENAI_CLIP, size=56), **small)
    loaded = load_model(_local(spec, path.parent))
    x = torch.randn(2, 3, 56, 56)
    with torch.inference_mode():
        hidden = clip.vision_model(pixel_values=x, output_hidden_states=True).hidden_states[-1]
        want = projection(hidden).mean(dim=1)
        torch.testing.assert_close(loaded.features(x), want, atol=1e-5, rtol=1e-5)
        assert tuple(loaded.module.tokens(x).shape) == (2, 4, 4, 64)


# -- MUSK ------------------------------------------------------------------------------------

MUSK_SMALL = {"depth": 2, "embed_dim": 64, "num_heads": 4}
# the state lilab-stanford/MUSK's code builds and loads (at 714b666: timm.create_model(
# "musk_large_patch16_384").state_dict(), what load_model_and_may_interpolate reads from the
# Hub's model.safetensors with no prefix stripped): names and shapes
AUTHORS_KEYS = json.loads((Path(__file__).parent / "patch_checkpoint_keys.json").read_text())
# the timm Block's tensors -> the authors' vision expert's, per layer
_THEIRS = {
    "norm1.": "self_attn_layer_norm.A.",
    "attn.norm.": "self_attn.inner_attn_ln.A.",
    "attn.proj.": "self_attn.out_proj.A.",
    "norm2.": "final_layer_norm.A.",
    "mlp.fc1.": "ffn.A.fc1.",
    "mlp.norm.": "ffn.A.ffn_layernorm.",
    "mlp.fc2.": "ffn.A.fc2.",
}


def test_musk_is_registered_with_its_facts():
    spec = get_model("musk")
    facts = (spec.source, spec.repo, spec.output_dim, spec.native_mpp, spec.tile, spec.pooling,
             spec.gated, spec.precision, spec.licence, spec.text, spec.family)  # fmt: skip
    assert facts == ("hf-hub", "xiangjx/musk", 2048, None, 384, "multiscale", True, "fp16",
                     "CC-BY-NC-ND-4.0", None, "musk")  # fmt: skip
    assert spec.arch.kwargs == {"scales": (1, 2)} and spec.weights_file is None
    half = (0.5, 0.5, 0.5)  # timm's Inception mean and std, as the README normalises
    assert spec.data == {"input_size": (3, 384, 384), "interpolation": "bicubic",
                         "crop_pct": 1.0, "mean": half, "std": half}  # fmt: skip


def test_musk_authors_whole_checkpoint_loads_strictly_its_image_half_kept():
    """Every tensor of the authors' MUSK state, as their code names and shapes it, on the
    meta device: the image half loads strictly into ours; the language experts, the text
    embedding, both heads, the temperature and the mask token are what is left out."""
    from tilestore.embed.models.musk import musk_state

    theirs = {k: torch.empty(shape, device="meta") for k, shape in AUTHORS_KEYS["musk"].items()}
    with torch.device("meta"):
        backbone = build(get_model("musk"))
    state = musk_state(theirs)
    backbone.load_state_dict(state, strict=True, assign=True)
    assert tuple(state["vit.pos_embed"].shape) == (1, 1 + 24 * 24, 1024)  # rows 2..578
    assert tuple(state["vit.blocks.23.attn.qkv.weight"].shape) == (3 * 1024, 1024)
    image = ("beit3.vision_embed.cls_token", "beit3.vision_embed.proj.")
    used = {k for k in theirs if ".A." in k or k.startswith(image)}
    left = set(theirs) - used
    assert len(used) == 24 * 20 + 3 + 3  # per layer 20; positions, final norm; class, patches
    assert {k for k in left if ".B." not in k} == {
        "beit3.text_embed.weight", "beit3.vision_embed.mask_token", "language_head.weight",
        "vision_head.weight", "logit_scale",
    }  # fmt: skip
    assert sum(".B." in k for k in left) == 24 * 20 + 3  # the language experts, all of them


def _musk_checkpoint(folder: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in the authors' layout, small: our model's tensors under their names
    (the query, key and value apart, the position table with its two unread rows first),
    a language expert beside each vision one, the text embedding, the heads, the
    temperature and the mask token; saved as the Hub's model.safetensors."""
    from tilestore.embed.models.musk import musk

    generator = torch.Generator().manual_seed(seed)
    ours = musk(**MUSK_SMALL).state_dict()
    theirs: dict[str, torch.Tensor] = {}
    for key, value in ours.items():
        value = 0.05 * torch.randn(value.shape, generator=generator) + (
            1.0 if "norm" in key and key.endswith("weight") else 0.0
        )
        key = key.removeprefix("vit.")
        if key.startswith("blocks."):
            _, index, rest = key.split(".", 2)
            prefix = f"beit3.encoder.layers.{index}."
            if rest.startswith("attn.qkv."):
                for part, chunk in zip("qkv", value.chunk(3), strict=True):
                    theirs[f"{prefix}self_attn.{part}_proj.A.{rest.split('.')[-1]}"] = chunk
                continue
            new = next(
                prefix + v + rest[len(k) :] for k, v in _THEIRS.items() if rest.startswith(k)
            )
        elif key == "pos_embed":
            new, value = (
                "beit3.encoder.embed_positions.A.weight",
                torch.cat([torch.randn(2, value.shape[-1], generator=generator), value[0]]),
            )
        else:
            new = {
                "cls_token": "beit3.vision_embed.cls_token",
                "norm.weight": "beit3.encoder.layer_norm.A.weight",
                "norm.bias": "beit3.encoder.layer_norm.A.bias",
            }.get(key, "beit3.vision_embed." + key.removeprefix("patch_embed."))
        theirs[new] = value
    for key in [k for k in theirs if ".A." in k]:  # the language experts: other numbers
        theirs[key.replace(".A.", ".B.")] = torch.randn(theirs[key].shape, generator=generator)
    theirs["beit3.encoder.embed_positions.B.weight"] = torch.randn(1024, 64, generator=generator)
    theirs |= {"beit3.text_embed.weight": torch.randn(100, 64, generator=generator),
               "beit3.vision_embed.mask_token": torch.randn(1, 1, 64, generator=generator),
               "vision_head.weight": torch.randn(64, 64, generator=generator),
               "language_head.weight": torch.randn(64, 64, generator=generator),
               "logit_scale": torch.tensor(2.6)}  # fmt: skip
    folder.mkdir(parents=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in theirs.items()},
                                folder / "model.safetensors")  # fmt: skip
    return theirs


def _authors_class_token(state: dict[str, torch.Tensor], x: torch.Tensor, heads: int):
    """torchscale's BEiT3 on an image, written out on the authors' tensor names: patches and
    the class token, positions from row 2, then per layer (the vision experts, ``A``)
    pre-norm attention with the sub-LayerNorm before its output projection and a GELU
    feed-forward with the sub-LayerNorm on its hidden units, eps 1e-5; the final LayerNorm's
    class token (``encoder_out[:, 0]``)."""

    def ln(t, name):
        return F.layer_norm(t, t.shape[-1:], state[name + ".weight"], state[name + ".bias"], 1e-5)

    def linear(t, name):
        return F.linear(t, state[name + ".weight"], state[name + ".bias"])

    conv = state["beit3.vision_embed.proj.weight"]
    t = F.conv2d(x, conv, state["beit3.vision_embed.proj.bias"], stride=conv.shape[-1])
    t = t.flatten(2).transpose(1, 2)
    t = torch.cat([state["beit3.vision_embed.cls_token"].expand(len(x), -1, -1), t], dim=1)
    t = t + state["beit3.encoder.embed_positions.A.weight"][2 : 2 + t.shape[1]]
    n, length, dim = t.shape
    for i in range(sum(k.endswith("final_layer_norm.A.weight") for k in state)):
        p = f"beit3.encoder.layers.{i}."
        h = ln(t, p + "self_attn_layer_norm.A")
        q, k, v = (
            linear(h, f"{p}self_attn.{c}_proj.A").reshape(n, length, heads, -1).transpose(1, 2)
            for c in "qkv"
        )
        weights = torch.softmax((q * (dim // heads) ** -0.5) @ k.transpose(-1, -2), dim=-1)
        attn = (weights @ v).transpose(1, 2).reshape(n, length, dim)
        t = t + linear(ln(attn, p + "self_attn.inner_attn_ln.A"), p + "self_attn.out_proj.A")
        h = F.gelu(linear(ln(t, p + "final_layer_norm.A"), p + "ffn.A.fc1"))
        t = t + linear(ln(h, p + "ffn.A.ffn_layernorm"), p + "ffn.A.fc2")
    return ln(t, "beit3.encoder.layer_norm.A")[:, 0]


def test_musk_is_the_authors_multiscale_class_tokens_on_real_tiles(tmp_path, cmu_pixels):
    """Their checkpoint's layout loaded by ours: the features of real CMU-1 tiles are the
    class token of the tile, then the mean class token of the tile upsampled (bicubic) to
    768 px and cut into four 384 px tiles (MultiScaleForward with scales [1, 2]), each the
    authors' BEiT-3 vision path on their own tensor names; the patch tokens are the tile's."""
    theirs = _musk_checkpoint(tmp_path / "musk")
    loaded = load_model(_local(_small(get_model("musk"), **MUSK_SMALL), tmp_path / "musk"))
    assert loaded.output_dim == 2 * 64 and loaded.module.num_prefix_tokens == 2
    y = cmu_pixels.shape[0] // 2
    tiles = np.stack([cmu_pixels[y : y + 384, x : x + 384] for x in (0, 384, 768)])
    with torch.inference_mode():
        x = loaded.transform(torch.from_numpy(tiles))
        features = loaded.features(x)
        big = F.interpolate(x, size=768, mode="bicubic")
        quarters = [big[..., r : r + 384, c : c + 384] for r in (0, 384) for c in (0, 384)]
        want = torch.cat(
            [
                _authors_class_token(theirs, x, heads=4),
                torch.stack([_authors_class_token(theirs, q, heads=4) for q in quarters]).mean(0),
            ],
            dim=1,
        )
        torch.testing.assert_close(features, want, atol=2e-5, rtol=1e-4)
        assert tuple(loaded.module.tokens(x).shape) == (3, 24, 24, 64)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("beit3.encoder.relative_position.weight", r"unexpected \['beit3.encoder.relative_posi"),
        ("-beit3.encoder.layers.1.self_attn.k_proj.A.bias", r"\['q', 'v'\] of q, k, v for"),
        ("-beit3.encoder.layers.0.ffn.A.ffn_layernorm.weight", r"missing \['vit.blocks.0.mlp.norm"),
    ],
)
def test_musk_checkpoint_with_a_tensor_too_many_or_too_few_is_refused(tmp_path, change, message):
    theirs = _musk_checkpoint(tmp_path / "musk")
    if change.startswith("-"):
        del theirs[change[1:]]
    else:
        theirs[change] = torch.zeros(32, 4)
    safetensors.torch.save_file(theirs, tmp_path / "musk" / "model.safetensors")
    spec = _local(_small(get_model("musk"), **MUSK_SMALL), tmp_path / "musk")
    with pytest.raises(ModelError, match=message):
        load_model(spec)
