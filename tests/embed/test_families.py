"""Every registered encoder's architecture, built on the meta device (no weights, no GPU),
and each family's published layouts loaded into it strictly with the same features."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import timm
import torch

from tilestore.embed.models import ModelError, ModelSpec, list_models, load_model
from tilestore.embed.models.encoder import Encoder
from tilestore.embed.models.families import FAMILIES, build
from tilestore.embed.models.load import data_config
from tilestore.embed.models.spec import Arch

REGISTERED = [s for s in list_models() if s.arch is not None]


def test_every_family_has_encoders_and_the_list_is_long():
    assert {s.family for s in REGISTERED} == set(FAMILIES)
    assert len(REGISTERED) >= 25


@pytest.mark.parametrize("spec", REGISTERED, ids=lambda s: s.name)
def test_builds_on_the_meta_device_with_its_dim_and_pooling(spec):
    with torch.device("meta"):
        encoder = Encoder.of(build(spec), spec)
        size = data_config(spec, encoder)["input_size"][-1]
        x = torch.zeros(2, 3, size, size)
        features = encoder(x)
        assert tuple(features.shape) == (2, spec.output_dim)
        if spec.pooling in ("cls", "cls+mean", "mean") and not spec.projection:
            tokens = encoder.sequence(x)
            width = tokens.shape[-1]
            want = {"cls": width, "mean": width, "cls+mean": 2 * width}[spec.pooling]
            assert spec.output_dim == want  # the dim the pooling of these tokens gives


KEYS = json.loads((Path(__file__).parent / "encoder_keys.json").read_text())


@pytest.mark.parametrize("spec", REGISTERED, ids=lambda s: s.name)
def test_state_dict_keys_and_shapes_are_the_ones_checked_against_the_references(spec):
    """Each architecture's tensors (names, shapes, parameter count) as they were when
    bench/encoders.py matched it to its reference (bench/RESULTS.md, issue 35): a published
    checkpoint loads only into these, so a timm or transformers release that renames or
    reshapes them fails here, not on a user's node. Counts: UNI 303.4M, UNI2-h 681.4M,
    Prov-GigaPath 1,135.0M, Hibou-B 85.7M, as their cards give. transformers maps its
    files' names onto its modules itself (and renamed the modules in its version 5): for
    its family the counts are compared, not the names."""
    with torch.device("meta"):
        backbone = build(spec)
    state = backbone.state_dict()
    lines = "\n".join(f"{k}:{tuple(v.shape)}" for k, v in sorted(state.items()))
    found = {
        "tensors": len(state),
        "parameters": sum(p.numel() for p in backbone.parameters()),
        "keys_sha256": hashlib.sha256(lines.encode()).hexdigest()[:16],
    }
    want = dict(KEYS[spec.name])
    if FAMILIES[spec.family].load is not None:  # loaded by its own library
        del found["keys_sha256"], want["keys_sha256"]
    assert found == want


def test_prefix_tokens_are_the_class_token_and_the_registers():
    prefixes = {}
    for name in ("uni", "uni2-h", "virchow2", "h-optimus-0", "kaiko-vitl14", "chief-ctranspath"):
        spec = next(s for s in REGISTERED if s.name == name)
        with torch.device("meta"):
            prefixes[name] = Encoder.of(build(spec), spec).num_prefix_tokens
    assert prefixes == {
        "uni": 1, "uni2-h": 9, "virchow2": 5, "h-optimus-0": 5, "kaiko-vitl14": 5,
        "chief-ctranspath": 0,
    }  # fmt: skip


def _folder(tmp_path, state, config=None, name="model.safetensors"):
    import safetensors.torch

    tmp_path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in state.items()}
    if name.endswith(".safetensors"):
        safetensors.torch.save_file(state, tmp_path / name)
    else:
        torch.save(state, tmp_path / name)
    return tmp_path


def _local(spec: ModelSpec, folder) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, source="local", repo=str(folder), output_dim=None)


def test_dinov2_layout_loads_into_timm_with_the_same_features(tmp_path):
    """OpenMidnight's published layout (DINOv2's): registers, the class token's position in
    the table, SwiGLU as w12/w3. Made here from a timm model by the inverse mapping."""
    kwargs = {"img_size": 224, "depth": 2}
    spec = ModelSpec(
        "om", "hf-hub", "x/y", None, 0.5, pooling="cls", data={"input_size": (3, 224, 224)},
        arch=Arch("timm", "vit_small_patch14_reg4_dinov2", kwargs, convert="dinov2"),
    )  # fmt: skip
    timm_model = timm.create_model("vit_small_patch14_reg4_dinov2", num_classes=0, **kwargs)
    with torch.no_grad():  # (initialised near 0, cls - pos + pos would lose its digits)
        timm_model.cls_token.normal_()
    state = timm_model.state_dict()
    cls_pos = torch.randn(1, 1, state["pos_embed"].shape[-1]) / 8
    theirs = {
        k.replace("mlp.fc1", "mlp.w12").replace("mlp.fc2", "mlp.w3"): v
        for k, v in state.items()
        if k not in ("reg_token", "cls_token", "pos_embed")
    }
    theirs |= {
        "register_tokens": state["reg_token"],
        "cls_token": state["cls_token"] - cls_pos,
        "pos_embed": torch.cat([cls_pos, state["pos_embed"]], dim=1),
        "mask_token": torch.zeros(1, state["cls_token"].shape[-1]),
    }
    if not any(".w12." in k for k in theirs):
        pytest.skip("this timm dinov2 small uses a plain MLP")
    loaded = load_model(_local(spec, _folder(tmp_path, theirs, name="pytorch_model.bin")))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.features(x), timm_model.eval().forward_features(x)[:, 0])


def test_ctranspath_layout_of_its_authors_loads_into_timms_swin(tmp_path):
    """The authors' timm 0.5 Swin puts each stage's downsampling at its end and saves the
    masks it computes: made here from our model by the inverse mapping, then loaded."""
    spec = next(s for s in REGISTERED if s.name == "chief-ctranspath")
    ours = build(spec).eval()
    state = ours.state_dict()
    theirs = {}
    for key, value in state.items():
        if "relative_position_index" in key:
            continue
        if ".downsample." in key:
            stage = int(key.split(".")[1])
            key = key.replace(f"layers.{stage}.", f"layers.{stage - 1}.", 1)
        theirs[key] = value
    theirs["layers.0.blocks.1.attn_mask"] = torch.zeros(64, 49, 49)
    folder = tmp_path / "ctp"
    folder.mkdir()
    torch.save({"model": theirs}, folder / "CHIEF_CTransPath.pth")
    loaded = load_model(_local(spec, folder))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        want = ours.forward_features(x).mean(dim=(1, 2))
        torch.testing.assert_close(loaded.features(x), want)


def test_conch_v1_takes_the_vision_tower_of_the_whole_checkpoint(tmp_path):
    spec = next(s for s in REGISTERED if s.name == "conch-v1")
    tower = build(spec)
    state = {f"visual.{k}": torch.randn(v.shape) for k, v in tower.state_dict().items()}
    extra = {"visual.attn_pool_caption.query": torch.randn(256, 768), "text.token_embedding.weight":
             torch.randn(8, 768), "logit_scale": torch.ones(()), "visual.proj_contrast":
             torch.randn(512, 512)}  # fmt: skip
    folder = _folder(tmp_path, {**state, **extra}, name="pytorch_model.bin")
    loaded = load_model(_local(spec, folder))
    assert loaded.output_dim == 512
    torch.testing.assert_close(
        loaded.module.backbone.attn_pool_contrast.query, state["visual.attn_pool_contrast.query"]
    )
    missing = {k: v for k, v in state.items() if "ln_contrast" not in k}
    with pytest.raises(ModelError, match=r"weights do not fit.*missing \['ln_contrast"):
        load_model(_local(spec, _folder(tmp_path / "m", missing, name="pytorch_model.bin")))


def test_conch_v15_position_table_is_the_authors_interpolation():
    from tilestore.embed.models.zoo import _authors_pos_embed

    spec = next(s for s in REGISTERED if s.name == "conch-v1.5")
    trunk = build(spec).trunk
    table = torch.randn(1, 197, 8)
    table[:, 1:] = 0.25  # bicubic interpolation keeps a constant table constant
    out = _authors_pos_embed(table, trunk)
    assert out.shape == (1, 785, 8)
    torch.testing.assert_close(out[:, :1], table[:, :1])
    torch.testing.assert_close(out[:, 1:], torch.full((1, 784, 8), 0.25))


def test_plip_equals_transformers_clip_image_features(tmp_path):
    """The reference for PLIP is transformers' own CLIPModel.get_image_features, which runs
    offline: a small random CLIP saved whole (text tower too) gives the same features."""
    transformers = pytest.importorskip("transformers")
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "image_size": 224, "patch_size": 32}  # fmt: skip
    config = transformers.CLIPConfig(
        vision_config=vision,
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2},
        projection_dim=24,
    )  # fmt: skip
    clip = transformers.CLIPModel(config).eval()
    folder = tmp_path / "plip"
    clip.save_pretrained(folder)
    spec = next(s for s in REGISTERED if s.name == "plip")
    loaded = load_model(_local(spec, folder))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        want = clip.get_image_features(pixel_values=x)
        want = getattr(want, "pooler_output", want)
        torch.testing.assert_close(loaded.features(x), want, atol=1e-5, rtol=1e-5)
    assert loaded.output_dim == 24


@pytest.mark.parametrize("prefix", ["", "vit."])
def test_phikon_loads_with_or_without_the_task_prefix(tmp_path, prefix):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=224, patch_size=16,
    )  # fmt: skip
    vit = transformers.ViTModel(config, add_pooling_layer=True).eval()
    state = {prefix + k: v for k, v in vit.state_dict().items()}
    folder = _folder(tmp_path, state, config.to_dict())
    spec = next(s for s in REGISTERED if s.name == "phikon")
    loaded = load_model(_local(spec, folder))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        want = vit(pixel_values=x).last_hidden_state[:, 0]
        torch.testing.assert_close(loaded.features(x), want, atol=1e-5, rtol=1e-5)


def test_midnight_cls_and_mean_from_transformers_dinov2(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       patch_size=14, image_size=224)  # fmt: skip
    model = transformers.Dinov2Model(config).eval()
    folder = _folder(tmp_path, model.state_dict(), config.to_dict())
    spec = next(s for s in REGISTERED if s.name == "midnight")
    loaded = load_model(_local(spec, folder))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        hidden = model(pixel_values=x).last_hidden_state
        want = torch.cat([hidden[:, 0], hidden[:, 1:].mean(1)], dim=-1)
        torch.testing.assert_close(loaded.features(x), want, atol=1e-5, rtol=1e-5)


def test_hibou_hub_layout_equals_transformers_dinov2_with_registers(tmp_path):
    """Hibou's Hub repo holds transformers' DINOv2-with-registers layout (and a config.json
    for its remote code, which is not read): a small such model, random, loads into timm's
    registers ViT with the same pooled CLS token as transformers' own forward."""
    from dataclasses import replace

    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=14,
        image_size=224, num_register_tokens=4, use_swiglu_ffn=True, layerscale_value=0.1,
    )  # fmt: skip
    hf = transformers.Dinov2WithRegistersModel(config).eval()
    with torch.no_grad():  # tokens far from 0, so a misplaced one shows
        for name in ("cls_token", "register_tokens", "position_embeddings"):
            getattr(hf.embeddings, name).normal_()
    hf.save_pretrained(tmp_path / "hibou")  # the files as transformers publishes them
    folder = tmp_path / "hibou"
    hibou = next(s for s in REGISTERED if s.name == "hibou-b")
    # SwiGLU of (int(4 * 64 * 2 / 3) + 7) // 8 * 8 = 176 hidden units, packed: 352 = 5.5 x 64
    small = {"embed_dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 5.5}
    spec = replace(hibou, arch=replace(hibou.arch, kwargs={**hibou.arch.kwargs, **small}))
    loaded = load_model(_local(spec, folder))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        want = hf(pixel_values=x).pooler_output
        torch.testing.assert_close(loaded.features(x), want, atol=1e-5, rtol=1e-5)
    import safetensors.torch

    published = safetensors.torch.load_file(folder / "model.safetensors")
    broken = {k: v for k, v in published.items() if "attention.attention.key" not in k}
    with pytest.raises(ModelError, match=r"query, key, value"):
        load_model(_local(spec, _folder(tmp_path / "b", broken, config.to_dict())))


def test_transformers_dinov2_without_a_key_projection_is_refused_naming_it(tmp_path):
    """The Hub layout of a transformers DINOv2 (saved as transformers publishes it) with one
    layer's key bias gone: one line naming what the layer has and which tensor lacks it."""
    from dataclasses import replace

    import safetensors.torch

    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2WithRegistersConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=14,
        image_size=224, num_register_tokens=4, use_swiglu_ffn=True,
    )  # fmt: skip
    transformers.Dinov2WithRegistersModel(config).save_pretrained(tmp_path / "hibou")
    weights = tmp_path / "hibou" / "model.safetensors"
    state = safetensors.torch.load_file(weights)
    (key,) = [k for k in state if k.endswith("layer.1.attention.attention.key.bias")]
    del state[key]
    safetensors.torch.save_file(state, weights)
    hibou = next(s for s in REGISTERED if s.name == "hibou-b")
    small = {"embed_dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 5.5}
    spec = replace(hibou, arch=replace(hibou.arch, kwargs={**hibou.arch.kwargs, **small}))
    with pytest.raises(ModelError, match=r"the checkpoint has \['query', 'value'\] of query, key, "
                       r"value for blocks\.1\.attn\.qkv\.bias$"):  # fmt: skip
        load_model(_local(spec, tmp_path / "hibou"))


def test_virchow2_cls_is_the_class_token_half_of_virchow2():
    """`virchow2-cls` (STAMP's, TRIDENT's virchow2-cls) reads the same weights and tokens as
    `virchow2`: its features are the first 1,280 of virchow2's CLS + mean, bit for bit."""
    from dataclasses import replace

    from tilestore.embed.models import get_model, load_model

    small = {"depth": 2, "embed_dim": 96, "num_heads": 4}  # SwiGLU: 512 hidden units, even

    def random_small(name):
        spec = get_model(name)
        arch = replace(spec.arch, kwargs={**spec.arch.kwargs, **small})
        return load_model(replace(spec, source="random", arch=arch, output_dim=None))

    both, cls = random_small("virchow2"), random_small("virchow2-cls")
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        whole, alone = both.features(x), cls.features(x)
    assert whole.shape == (2, 192) and alone.shape == (2, 96)
    assert torch.equal(alone, whole[:, :96])
    assert get_model("virchow2-cls").output_dim == 1280
    assert get_model("virchow2").output_dim == 2560
