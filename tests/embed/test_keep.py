"""KEEP (``Astaxanthin/KEEP``): random weights saved in the Hub's layout (its whole KEEPModel
state, layer scales named ``weight`` as its remote code names them, its config.json, a BERT
WordPiece vocabulary), loaded by ours offline, and compared on real CMU-1 tiles with the
authors' forward written out here; zero-shot scores against theirs."""

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
from torch import nn

from tilestore.embed.models import ModelError, get_model, load_model
from tilestore.embed.zeroshot import ZeroShotOptions, classify
from tilestore.embeddings.scores import read_tile_scores
from tilestore.plan import PlanOptions

transformers = pytest.importorskip("transformers")

from tests.embed.test_zeroshot import ONE, _embedded, _prompts  # noqa: E402

SMALL_VIT = {"depth": 2, "embed_dim": 64, "num_heads": 4}
PROJECTION = 32
TEXT = {"vocab_size": 0, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 512}  # fmt: skip
WORDS = ["an", "h", "&", "e", "image", "of", "tumor", "fibrous", "stroma", "normal", "tissue",
         "carcinoma", "."]  # fmt: skip
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s"]


class AuthorsKEEP(nn.Module):
    """KEEPModel as the authors define it (MAGIC-AI4Med/KEEP at a346a70,
    quick_start/keep_inference.py; the Hub's modeling_keep.py is the same), small: timm's
    vit_large_patch16_224 with their arguments, the visual_head, BertModel of the config's
    text_config, logit_scale; encode_image and encode_text as they compute them."""

    def __init__(self, text_config: dict, projection_dim: int):
        super().__init__()
        self.visual = timm.create_model(
            "vit_large_patch16_224", pretrained=False, img_size=224, patch_size=16,
            init_values=1e-5, num_classes=0, dynamic_img_size=True, **SMALL_VIT,
        )  # fmt: skip
        self.visual_head = nn.Sequential(
            nn.Linear(self.visual.num_features, projection_dim),
            nn.GELU(),
            nn.Linear(projection_dim, projection_dim),
        )
        self.text = transformers.BertModel(transformers.BertConfig(**text_config))
        self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.04))

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.visual_head(self.visual(x)), dim=-1)

    def encode_text(self, inputs) -> torch.Tensor:
        return F.normalize(self.text(**inputs).pooler_output, dim=-1)


def _keep_checkpoint(folder: Path, layer_scale: str = "weight") -> AuthorsKEEP:
    """Random weights in the Hub's files: model.safetensors (the whole state; layer scales
    ``ls1.weight`` as its remote code's LayerScale names them, or timm's ``gamma`` as the
    authors' local files keep them), config.json (KEEP's: vision_config, text_config,
    projection_dim), the BERT vocabulary (vocab.txt, tokenizer_config.json)."""
    text = {**TEXT, "vocab_size": len(VOCAB)}
    model = AuthorsKEEP(text, PROJECTION).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = 0.05 * torch.randn(tensor.shape, generator=generator)
            norm = name.endswith("weight") and ("norm" in name.lower())
            tensor.copy_(noise + (1.0 if norm else 0.0))
        model.logit_scale.fill_(np.log(20.0))
    state = {
        k.replace(".gamma", f".{layer_scale}") if ".ls" in k else k: v.contiguous()
        for k, v in model.state_dict().items()
    }
    folder.mkdir(parents=True)
    safetensors.torch.save_file(state, folder / "model.safetensors")
    config = {
        "architectures": ["KEEPModel"],
        "auto_map": {"AutoConfig": "modeling_keep.KEEPConfig",
                     "AutoModel": "modeling_keep.KEEPModel"},
        "model_type": "keep",
        "projection_dim": PROJECTION,
        "vision_config": {"img_size": 224, "patch_size": 16, "init_values": 1e-5,
                          "num_classes": 0, "dynamic_img_size": True},
        "text_config": text,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(
        folder
    )
    return model


def _spec(folder: Path):
    spec = get_model("keep")
    arch = replace(spec.arch, kwargs={**spec.arch.kwargs, **SMALL_VIT})
    return replace(spec, arch=arch, output_dim=None, source="local", repo=str(folder))


def _tiles(cmu_pixels: np.ndarray, n: int = 6, side: int = 256) -> torch.Tensor:
    """Real CMU-1 tiles (n, side, side, 3) uint8, from a row across its tissue."""
    y = cmu_pixels.shape[0] // 2
    tiles = [cmu_pixels[y : y + side, x : x + side] for x in range(0, n * side, side)]
    return torch.from_numpy(np.stack(tiles))


@pytest.mark.parametrize("layer_scale", ["weight", "gamma"])
def test_keep_is_the_authors_encode_image_on_real_tiles(tmp_path, cmu_pixels, layer_scale):
    """Our features (the class token through their head, unit length) are the authors'
    encode_image of the same transformed tiles, from the Hub's files and from files with
    timm's own layer-scale names."""
    theirs = _keep_checkpoint(tmp_path / "keep", layer_scale)
    loaded = load_model(_spec(tmp_path / "keep"))
    assert loaded.output_dim == PROJECTION and loaded.weights.endswith("model.safetensors")
    described = loaded.describe()
    assert (described["pooling"], described["projection"]) == ("cls", "keep")
    pixels = loaded.transform(_tiles(cmu_pixels))
    with torch.inference_mode():
        ours, want = loaded.features(pixels), theirs.encode_image(pixels)
    torch.testing.assert_close(ours, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(ours)))
    assert torch.nn.functional.cosine_similarity(ours, want).min() > 1 - 1e-6
    assert tuple(loaded.module.tokens(pixels).shape) == (6, 14, 14, 64)  # the ViT's patches


def test_keep_with_a_layer_scale_missing_is_refused_in_one_line(tmp_path):
    _keep_checkpoint(tmp_path / "keep")
    path = tmp_path / "keep" / "model.safetensors"
    state = safetensors.torch.load_file(path)
    del state["visual.blocks.1.ls2.weight"]
    safetensors.torch.save_file(state, path)
    with pytest.raises(ModelError, match=r"^keep: weights do not fit .*blocks\.1\.ls2\.gamma"):
        load_model(_spec(tmp_path / "keep"))


def test_keep_zero_shot_equals_the_authors_scores_on_real_tiles(store, tmp_path):
    """One prompt per class: the class embedding is the authors' encode_text of the prompt
    (tokenised to 256 tokens, lower-cased, as their zero_shot_classifier does), and the
    scores are softmax(logit_scale * encode_image @ encode_text.T) of the same real tiles."""
    folder = tmp_path / "keep"
    theirs = _keep_checkpoint(folder)
    path = store()
    plan = PlanOptions(mpp="level0", tile=224)
    tiles, loaded = _embedded(path, "keep", folder, plan, 224, spec=_spec(folder))
    prompts = {"classnames": {k: [v[0].capitalize()] for k, v in ONE.items()}}  # "Tumor"
    classify([path], "keep", _prompts(tmp_path, prompts, name="one.json"),
             ZeroShotOptions(weights=folder, device="cpu"))  # fmt: skip
    tokenizer = transformers.BertTokenizer.from_pretrained(folder, do_lower_case=True)
    ids = tokenizer(["Tumor", "Fibrous stroma", "Normal tissue"], max_length=256,
                    padding="max_length", truncation=True, return_tensors="pt")  # fmt: skip
    with torch.inference_mode():
        image = theirs.encode_image(loaded.transform(torch.from_numpy(tiles)))
        text = theirs.encode_text(ids)
        want = torch.softmax(theirs.logit_scale.exp() * image @ text.T, dim=-1).numpy()
    got = read_tile_scores(path, "keep", "one")["probabilities"]
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert got.shape == (len(tiles), 3)


def test_keep_text_tower_without_its_text_config_is_refused_in_one_line(tmp_path):
    from tilestore.embed.models.text import load_text_tower

    folder = tmp_path / "keep"
    _keep_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["text_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"^keep: no config.json with a text_config beside"):
        load_text_tower(get_model("keep"), weights=folder)
