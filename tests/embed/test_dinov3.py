"""DINOv3 (issue 67): timm's ports read offline, their rotary periods rounded to bfloat16 as
the authors' release stores them. The authors' own code is the reference of
bench/encoders.py (``--dinov3``) and bench/dinov3_periods.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import timm
import torch

from tilestore.embed.models import ModelError, get_model, list_models, load_model
from tilestore.embed.models.catalogue import IMAGENET
from tilestore.embed.models.spec import Arch

SMALL = {"depth": 2, "embed_dim": 64, "num_heads": 4, "init_values": 0.5}
SIZES = {
    "dinov3-vits16": 384,
    "dinov3-vits16plus": 384,
    "dinov3-vitb16": 768,
    "dinov3-vitl16": 1024,
    "dinov3-vith16plus": 1280,
    "dinov3-vit7b16": 4096,
}


def _small(spec):
    arch = replace(spec.arch, kwargs={**spec.arch.kwargs, **SMALL})
    return replace(spec, arch=arch, output_dim=None)


def test_every_dinov3_size_with_public_weights_is_registered_as_its_authors_run_it():
    names = [spec.name for spec in list_models() if spec.name.startswith("dinov3-")]
    assert names == list(SIZES)
    for name, dim in SIZES.items():
        spec = get_model(name)
        assert spec.repo == f"timm/{spec.arch.name}.lvd1689m" and spec.output_dim == dim
        assert spec.pooling == "cls" and spec.native_mpp is None and spec.precision == "fp32"
        assert spec.arch.periods == "bf16" and spec.tile == 256
        assert spec.data["input_size"] == (3, 256, 256) and spec.data["crop_pct"] == 1.0
        assert (spec.data["mean"], spec.data["std"]) == IMAGENET
        assert spec.licence == "DINOv3 License" and not spec.gated


@pytest.mark.parametrize("name", ["dinov3-vits16", "dinov3-vith16plus", "dinov3-vit7b16"])
def test_dinov3_reads_timms_layout_offline_with_the_authors_rounded_periods(name, hf_cache):
    """Our features are timm's model's with its periods rounded to bfloat16 (the authors'
    release), bit for bit, and not timm's as it builds them (float32 periods)."""
    spec = get_model(name)
    args = {**spec.arch.kwargs, **SMALL}
    _, state = hf_cache(repo=spec.repo, arch=spec.arch.name, model_args=args)
    loaded = load_model(_small(spec))
    assert loaded.weights.endswith("model.safetensors") and loaded.output_dim == 64
    theirs = timm.create_model(spec.arch.name, pretrained=False, num_classes=0, **args).eval()
    theirs.load_state_dict(state)
    x = torch.randn(2, 3, 256, 256, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = theirs.forward_features(x)[:, 0]
        periods = theirs.rope.periods.clone()
        theirs.rope.periods.copy_(periods.to(torch.bfloat16).float())
        rounded = theirs.forward_features(x)[:, 0]
        ours = loaded.features(x)
    assert torch.equal(loaded.module.backbone.rope.periods, theirs.rope.periods)
    assert not torch.equal(theirs.rope.periods, periods)  # rounding changes them
    torch.testing.assert_close(ours, rounded, rtol=0, atol=0)
    assert not torch.equal(ours, plain)
    assert loaded.describe()["periods"] == "bf16"  # the recipe the stored record holds


def test_rounded_periods_on_an_architecture_without_dinov3s_rotary_table_are_refused():
    spec = replace(
        get_model("dinov3-vits16"),
        source="random",
        arch=replace(get_model("dinov3-vits16").arch, name="vit_tiny_patch16_224", kwargs={}),
    )
    with pytest.raises(ModelError, match="vit_tiny_patch16_224 has no DINOv3 rotary embedding"):
        load_model(spec)


def test_a_dinov3_checkpoint_is_built_once_on_the_meta_device(hf_cache, monkeypatch):
    """Its weights are assigned into a build on the meta device and its rotary table (the
    one state its checkpoint does not hold) made after, rounded: never a second build that
    draws random weights beside the checkpoint's (27 GB for the ViT-7B)."""
    spec = get_model("dinov3-vits16")
    hf_cache(repo=spec.repo, arch=spec.arch.name, model_args={**spec.arch.kwargs, **SMALL})
    create, made = timm.create_model, []

    def counted(*args, **kwargs):
        made.append(torch.empty(0).device.type)
        return create(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", counted)
    backbone = load_model(_small(spec)).module.backbone
    assert made == ["meta"]
    assert not any(t.is_meta for t in (*backbone.parameters(), *backbone.buffers()))
    periods = backbone.rope.periods
    assert torch.equal(periods, periods.to(torch.bfloat16).float())
    assert torch.equal(backbone.blocks[0].attn.k_bias, torch.zeros(64))


def test_a_fixed_size_dinov3_caches_its_rotary_table_from_the_rounded_periods(hf_cache):
    """Built for one input size (no dynamic size), timm caches the rotary table: it is made
    again from the rounded periods, so the features are the dynamic build's."""
    spec = get_model("dinov3-vits16")
    args = {**spec.arch.kwargs, **SMALL}
    hf_cache(repo=spec.repo, arch=spec.arch.name, model_args=args)
    fixed = replace(spec.arch, kwargs={**args, "dynamic_img_size": False})
    x = torch.randn(2, 3, 256, 256, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        dynamic = load_model(_small(spec)).features(x)
        cached = load_model(replace(spec, arch=fixed, output_dim=None)).features(x)
    torch.testing.assert_close(cached, dynamic, rtol=0, atol=0)


def test_periods_are_made_for_timms_dinov3_only():
    with pytest.raises(ValueError, match="periods='fp8' is made for timm's DINOv3 only"):
        Arch("timm", "vit_small_patch16_dinov3_qkvb", periods="fp8")
    with pytest.raises(ValueError, match="made for timm's DINOv3 only"):
        Arch("conch", "v1", periods="bf16")


def test_groups_whose_rotary_periods_differ_are_never_combined():
    """The rounding is part of the recipe a group records: two groups of one model whose
    periods were made otherwise are refused together, naming the fact."""
    from tilestore.embeddings.recipe import MixedResults, combine, recipe

    model = {"name": "dinov3-vits16", "architecture": "vit_small_patch16_dinov3_qkvb"}
    rounded = recipe({"model": {**model, "periods": "bf16"}})
    other = recipe({"model": {**model, "periods": "fp32"}})
    with pytest.raises(MixedResults, match="periods: bf16"):
        combine([("a.ome.zarr", rounded), ("b.ome.zarr", other)], "features")
