"""The patch encoders of issue 50 (PathOrchestra, mSTAR, Digepath, Prost40M, GenBio-PathFM,
iSight; MUSK in test_musk.py): each built small on random weights saved in the layout its
authors publish, loaded by our loader offline, and compared with the construction their code
uses where it runs here (timm's, transformers'); the full-size reference check is
bench/encoders.py's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import timm
import torch

from tilestore.embed.models import ModelError, get_model, load_model
from tilestore.embed.models.catalogue import IMAGENET, OPENAI_CLIP, _data

SMALL_VIT = {"depth": 2, "embed_dim": 64, "num_heads": 4}
TIMM_HUB = ["pathorchestra", "mstar", "digepath", "prost40m", "reddino-small", "reddino-large"]


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
