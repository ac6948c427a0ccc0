"""BiomedCLIP (issue 50): open_clip's CustomTextCLIP, timm's ViT-B/16 and a PubMedBERT text
tower whose config and tokenizer are a second Hub repo. Small random weights in the layout
it is published in (open_clip_pytorch_model.bin and open_clip_config.json; the BERT repo's
config.json and vocabulary) on a stand-in Hub (`FakeHub`): `models pull` fetches both
repos, the image tower and the text tower load from the cache offline and equal open_clip's
own hf-hub loading of that cache, on real tiles; a BERT repo the cache lacks is one line.
The full-size check against open_clip is bench/encoders.py's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.embed.test_zeroshot import ONE, WORDS, _embedded, _prompts, _reference_probabilities
from tilestore.embed.models import ModelError, get_model, hub, load_model
from tilestore.embed.models.catalogue import BIOMEDCLIP, OPENAI_CLIP
from tilestore.embed.models.text import load_text_tower
from tilestore.embed.zeroshot import ZeroShotOptions, classify
from tilestore.embeddings.scores import read_tile_scores
from tilestore.plan import PlanOptions

open_clip = pytest.importorskip("open_clip")

REPO = "microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"
BERT_REPO = "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "h", "&", "e",
         *dict.fromkeys(WORDS)]  # fmt: skip
# BERT-base's config made small (the repo's: 12 layers of 768, 30,522 tokens, 512 positions)
BERT = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": len(VOCAB),
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 512, "type_vocab_size": 2,
        "pad_token_id": 0}  # fmt: skip
# the repo's model_cfg with a small ViT (the 512-d joint space and 256 tokens kept)
SMALL = {**BIOMEDCLIP, "vision_cfg": {**BIOMEDCLIP["vision_cfg"],
                                      "timm_model_name": "vit_tiny_patch16_224"}}  # fmt: skip


def test_its_registry_facts_are_its_cards_and_its_configs():
    spec = get_model("biomedclip")
    assert (spec.repo, spec.output_dim, spec.native_mpp, spec.tile) == (REPO, 512, None, 224)
    assert (spec.family, spec.weights_file) == ("open_clip", "open_clip_pytorch_model.bin")
    assert (spec.data["mean"], spec.data["std"]) == OPENAI_CLIP  # its preprocess_cfg
    assert spec.data["input_size"] == (3, 224, 224) and spec.data["interpolation"] == "bicubic"
    assert (spec.pooling, spec.projection, spec.precision) == ("model", None, "fp32")
    assert (spec.licence, spec.gated, spec.text) == ("MIT", False, "open_clip")
    text = spec.arch.kwargs["text_cfg"]
    assert (text["hf_model_name"], text["context_length"]) == (BERT_REPO, 256)
    assert spec.arch.kwargs["vision_cfg"]["timm_model_name"] == "vit_base_patch16_224"


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights far from open_clip's and BERT's initialisation (norms' scales near 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            norm = "norm" in name.lower() and name.endswith("weight")
            tensor.copy_(0.05 * torch.randn(tensor.shape, generator=generator) + float(norm))


def _publish(fake_hub, seed: int = 5) -> torch.nn.Module:
    """Both repos on the stand-in Hub: the BERT's config and vocabulary, and the CLIP's
    config and weights as open_clip saves them (with the position ids transformers saved
    before 4.31, as the published file has them). Returns the model the weights are of."""
    bert = fake_hub.repo(BERT_REPO)
    (bert / "config.json").write_text(json.dumps(BERT))
    (bert / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    text = {**SMALL["text_cfg"], "hf_model_name": str(bert), "hf_model_pretrained": False}
    made = open_clip.model.CustomTextCLIP(**{**SMALL, "text_cfg": text}).eval()
    _randomize(made, seed)
    with torch.no_grad():
        made.logit_scale.fill_(4.0)  # a trained temperature's size (exp: 55)
    state = made.state_dict()
    state["text.transformer.embeddings.position_ids"] = torch.arange(512)[None]
    repo = fake_hub.repo(REPO)
    config = {"model_cfg": SMALL, "preprocess_cfg": {"mean": OPENAI_CLIP[0], "std": OPENAI_CLIP[1]}}
    (repo / "open_clip_config.json").write_text(json.dumps(config))
    torch.save(state, repo / "open_clip_pytorch_model.bin")
    return made


def test_pull_fetches_both_repos_and_it_loads_offline(fake_hub, monkeypatch):
    made = _publish(fake_hub)
    hub.pull("biomedclip")
    asked = {(repo, name) for _, repo, name in fake_hub.asked}
    assert {(REPO, "open_clip_config.json"), (REPO, "open_clip_pytorch_model.bin"),
            (BERT_REPO, "config.json"), (BERT_REPO, "vocab.txt")} <= asked  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("biomedclip")
    assert loaded.output_dim == 512 and "/snapshots/" in loaded.weights
    tower = load_text_tower(get_model("biomedclip"))
    assert tower.logit_scale == pytest.approx(float(made.logit_scale.detach().exp()))
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.features(x), made.encode_image(x))


def test_a_cache_without_its_bert_repo_is_one_line_naming_it_and_the_fix(fake_hub, monkeypatch):
    _publish(fake_hub)
    hub.pull("biomedclip")
    shutil.rmtree(hub.cache_dir() / f"models--{BERT_REPO.replace('/', '--')}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_model("biomedclip").output_dim == 512  # the image tower needs none of it
    with pytest.raises(ModelError) as caught:
        load_text_tower(get_model("biomedclip"))
    said = str(caught.value)
    assert said.startswith(f"biomedclip: {BERT_REPO} is not in the local cache ")
    assert "run `tilestore models pull biomedclip`" in said and "\n" not in said


def test_zero_shot_equals_open_clips_own_hub_loading_on_real_tiles(
    fake_hub, store, tmp_path, monkeypatch
):
    """Ours, from the cache `models pull` filled, offline: the stored features and the
    tiles' scores. The reference: open_clip's create_model_and_transforms and get_tokenizer
    of ``hf-hub:<repo>`` reading the same cache (huggingface_hub told it is offline)."""
    import huggingface_hub
    from PIL import Image

    _publish(fake_hub)
    hub.pull("biomedclip")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = store()
    spec = get_model("biomedclip")
    tiles, loaded = _embedded(path, "biomedclip", None, PlanOptions(mpp="level0", tile=224), 224,
                              spec=spec)  # fmt: skip
    prompts = _prompts(tmp_path, {"classnames": ONE}, name="one.json")
    classify([path], "biomedclip", prompts, ZeroShotOptions(device="cpu"))
    got = read_tile_scores(path, "biomedclip", "one")["probabilities"]

    cache = str(hub.cache_dir())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)
    theirs, _, preprocess = open_clip.create_model_and_transforms(f"hf-hub:{REPO}", cache_dir=cache)
    tokenizer = open_clip.get_tokenizer(f"hf-hub:{REPO}", cache_dir=cache)
    assert tokenizer.context_length == 256
    with torch.inference_mode():
        pixels = torch.stack([preprocess(Image.fromarray(t)) for t in tiles])
        torch.testing.assert_close(loaded.transform(torch.from_numpy(tiles)), pixels,
                                   atol=1e-6, rtol=0)  # fmt: skip
        image = theirs.eval().encode_image(pixels)
        torch.testing.assert_close(loaded.features(pixels), image, atol=1e-5, rtol=1e-5)
        text = theirs.encode_text(tokenizer(["tumor", "fibrous stroma", "normal tissue"]))
        cosine = F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
        want = _reference_probabilities(theirs.logit_scale.exp() * cosine)
    assert not np.allclose(want, 1 / 3, atol=1e-3)  # the classes are told apart
    np.testing.assert_allclose(got, want, atol=2e-5)
