"""MUSK (``xiangjx/musk``, lilab-stanford/MUSK): random weights saved in the authors' layout
(their whole BEiT-3 state, both experts of every layer, the heads, the temperature), loaded by
ours offline, and compared on real CMU-1 tiles with their forward written out here on their
own tensor names: the image features (the multiscale class tokens) and zero-shot (the
language experts on text their ``xlm_tokenizer`` cut, a SentencePiece model trained here
standing in for theirs). The full-size check against their code is bench/encoders.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from tests.embed.test_encoders_2026 import _local, _small
from tilestore.embed.models import ModelError, get_model, load_model
from tilestore.embed.models.families import build
from tilestore.embed.zeroshot import ZeroShotOptions, classify
from tilestore.embeddings.scores import read_tile_scores
from tilestore.plan import PlanOptions

VOCABULARY = 100  # the small checkpoint's text embedding rows (the tokenizer's ids fit in it)

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
                     "CC-BY-NC-ND-4.0", "musk", "musk")  # fmt: skip
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


def _musk_checkpoint(folder: Path, seed: int = 0, small: dict = MUSK_SMALL) -> dict:
    """Random weights in the authors' layout, small: our model's tensors under their names
    (the query, key and value apart, the position table with its two unread rows first),
    a language expert beside each vision one, the text embedding, the heads, the
    temperature and the mask token; saved as the Hub's model.safetensors."""
    from tilestore.embed.models.musk import musk

    generator = torch.Generator().manual_seed(seed)
    ours = musk(**small).state_dict()
    dim = small["embed_dim"]
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
    theirs["beit3.encoder.embed_positions.B.weight"] = torch.randn(1024, dim, generator=generator)
    theirs |= {"beit3.text_embed.weight": torch.randn(VOCABULARY, dim, generator=generator),
               "beit3.vision_embed.mask_token": torch.randn(1, 1, dim, generator=generator),
               "vision_head.weight": 0.2 * torch.randn(dim, dim, generator=generator),
               "language_head.weight": 0.2 * torch.randn(dim, dim, generator=generator),
               "logit_scale": torch.tensor(2.6)}  # fmt: skip
    folder.mkdir(parents=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in theirs.items()},
                                folder / "model.safetensors")  # fmt: skip
    return theirs


def _authors_class_token(state: dict[str, torch.Tensor], x: torch.Tensor, heads: int):
    """torchscale's BEiT3 on an image, written out on the authors' tensor names: patches and
    the class token, positions from row 2, the vision experts' layers (`_authors_layers`);
    the final LayerNorm's class token (``encoder_out[:, 0]``)."""
    conv = state["beit3.vision_embed.proj.weight"]
    t = F.conv2d(x, conv, state["beit3.vision_embed.proj.bias"], stride=conv.shape[-1])
    t = t.flatten(2).transpose(1, 2)
    t = torch.cat([state["beit3.vision_embed.cls_token"].expand(len(x), -1, -1), t], dim=1)
    t = t + state["beit3.encoder.embed_positions.A.weight"][2 : 2 + t.shape[1]]
    return _authors_layers(state, t, heads, "A")[:, 0]


def _authors_language_class(state, ids: torch.Tensor, padding: torch.Tensor, heads: int):
    """torchscale's BEiT3 on text (``textual_tokens``, ``text_padding_position``) and MUSK's
    ``with_head``, written out: the token embedding unscaled, positions from row 2, the
    padded tokens zeroed, the language experts' layers with the padded keys masked, the
    final LayerNorm's class token through ``language_head``."""
    t = state["beit3.text_embed.weight"][ids]
    t = t + state["beit3.encoder.embed_positions.B.weight"][2 : 2 + ids.shape[1]]
    t = t * (1 - padding[..., None].float())
    return _authors_layers(state, t, heads, "B", padding)[:, 0] @ state["language_head.weight"].T


def _authors_layers(state, t, heads: int, expert: str, padding=None):
    """Per layer (one expert's weights): pre-norm attention (the padded keys' scores -inf
    before a float32 softmax) with the sub-LayerNorm before its output projection, a GELU
    feed-forward with the sub-LayerNorm on its hidden units, eps 1e-5; the final LayerNorm."""

    def ln(t, name):
        return F.layer_norm(t, t.shape[-1:], state[name + ".weight"], state[name + ".bias"], 1e-5)

    def linear(t, name):
        return F.linear(t, state[name + ".weight"], state[name + ".bias"])

    n, length, dim = t.shape
    e = expert
    for i in range(sum(k.endswith(f"final_layer_norm.{e}.weight") for k in state)):
        p = f"beit3.encoder.layers.{i}."
        h = ln(t, f"{p}self_attn_layer_norm.{e}")
        q, k, v = (
            linear(h, f"{p}self_attn.{c}_proj.{e}").reshape(n, length, heads, -1).transpose(1, 2)
            for c in "qkv"
        )
        scores = (q * (dim // heads) ** -0.5) @ k.transpose(-1, -2)
        if padding is not None:
            scores = scores.masked_fill(padding[:, None, None, :].bool(), float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
        attn = (weights @ v).transpose(1, 2).reshape(n, length, dim)
        t = t + linear(ln(attn, f"{p}self_attn.inner_attn_ln.{e}"), f"{p}self_attn.out_proj.{e}")
        h = F.gelu(linear(ln(t, f"{p}final_layer_norm.{e}"), f"{p}ffn.{e}.fc1"))
        t = t + linear(ln(h, f"{p}ffn.{e}.ffn_layernorm"), f"{p}ffn.{e}.fc2")
    return ln(t, f"beit3.encoder.layer_norm.{e}")


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


# -- zero-shot -----------------------------------------------------------------------------

# a checkpoint whose heads are BEiT-3's width (64), as the text tower reads them from its width
TEXT_SMALL = {"depth": 2, "embed_dim": 128, "num_heads": 2}
CLASSES = {"tumor": ["tumor", "invasive carcinoma"], "stroma": ["fibrous stroma"],
           "normal": ["normal tissue", "benign tissue"]}  # fmt: skip
TEMPLATES = ["CLASSNAME.", "an H&E image of CLASSNAME."]
LONG = " ".join(["a histopathology image of tumor next to fibrous stroma and normal tissue"] * 20)


def _tokenizer(folder: Path) -> Path:
    """A SentencePiece unigram model trained here on the prompts' words (theirs, an XLM-R
    model of 64,000 pieces in their package, is not on this machine), saved beside the
    weights under their file's name."""
    spm = pytest.importorskip("sentencepiece")
    words = [w for names in CLASSES.values() for n in names for w in n.split()]
    corpus = [t.replace("CLASSNAME", n) for t in TEMPLATES for v in CLASSES.values() for n in v]
    corpus += [LONG, "a histopathology image of", *words] * 10
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_prefix=str(folder / "tokenizer"), vocab_size=60,
        model_type="unigram", hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    (folder / "tokenizer.model").rename(folder / "tokenizer.spm")
    return folder / "tokenizer.spm"


def _their_ids(tokenizer, texts: list[str], max_len: int = 100):
    """Their ``xlm_tokenizer`` (musk/utils.py) on each text: the ids between <s> and </s>
    cut to max_len - 2, put back between them, padded with <pad>; the padding mask."""
    rows, masks = [], []
    for text in texts:
        tokens = tokenizer.encode(text)[1:-1][: max_len - 2]
        tokens = [tokenizer.bos_token_id, *tokens, tokenizer.eos_token_id]
        masks.append([0] * len(tokens) + [1] * (max_len - len(tokens)))
        rows.append(tokens + [tokenizer.pad_token_id] * (max_len - len(tokens)))
    return torch.tensor(rows), torch.tensor(masks)


@pytest.fixture
def musk_text(tmp_path):
    """A small MUSK checkpoint in their layout, a SentencePiece model beside it."""
    folder = tmp_path / "musk"
    theirs = _musk_checkpoint(folder, seed=3, small=TEXT_SMALL)
    _tokenizer(folder)
    return folder, theirs


@pytest.fixture
def their_tokenizer(musk_text, tmp_path):
    """Their ``XLMRobertaTokenizer(tokenizer.spm)``: transformers' own reading of the model
    (transformers 5 converts it, through protobuf, from the file under XLM-R's name)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("google.protobuf")
    folder = tmp_path / "xlm-r"
    folder.mkdir()
    shutil.copy(musk_text[0] / "tokenizer.spm", folder / "sentencepiece.bpe.model")
    return transformers.XLMRobertaTokenizer.from_pretrained(folder)


def test_musk_text_tower_is_the_authors_language_path_and_cuts_text_as_theirs(
    musk_text, their_tokenizer
):
    from tilestore.embed.models.text import load_text_tower

    (folder, theirs), tokenizer = musk_text, their_tokenizer
    tower = load_text_tower(get_model("musk"), weights=folder)
    texts = ["tumor.", "an H&E image of fibrous stroma.", LONG]
    ids, padding = _their_ids(tokenizer, texts)
    assert padding[2].sum() == 0 and padding[0].sum() > 90  # the long one cut to 100
    with torch.inference_mode():
        want = F.normalize(_authors_language_class(theirs, ids, padding, heads=2), dim=-1)
        torch.testing.assert_close(tower.embed(texts), want, atol=2e-6, rtol=1e-5)
    assert tower.logit_scale == 100.0 and not tower.unit_classes  # their benchmark's rule
    assert tower.weights == str(folder / "model.safetensors")


def test_musk_zero_shot_equals_the_authors_scores_on_real_tiles(
    musk_text, their_tokenizer, store, tmp_path
):
    """The scores `classify` writes are their zero-shot benchmark's (benchmarks/clip_benchmark/
    metrics/zeroshot_classification.py): the image through ``vision_head`` (``with_head``,
    ``ms_aug`` off: the tile's own class token, the first half of the stored features), made
    unit; each class the mean of its prompts' unit text embeddings (templates filled), not
    made unit again (for MUSK alone they leave that line out; the classes here have 2, 1
    and 2 names, so means of other lengths); logits 100 x their products, softmaxed."""
    from tests.embed.test_zeroshot import _embedded, _prompts

    (folder, theirs), tokenizer = musk_text, their_tokenizer
    path = store()
    spec = _local(_small(get_model("musk"), **TEXT_SMALL), folder)
    tiles, loaded = _embedded(path, "musk", folder, PlanOptions(mpp="level0", tile=384), 384,
                              spec=spec)  # fmt: skip
    prompts = _prompts(tmp_path, {"classnames": CLASSES, "templates": TEMPLATES})
    (done,) = classify([path], "musk", prompts, ZeroShotOptions(weights=folder, device="cpu"))
    with torch.inference_mode():
        x = loaded.transform(torch.from_numpy(tiles))
        image = _authors_class_token(theirs, x, heads=2) @ theirs["vision_head.weight"].T
        rows = []
        for names in CLASSES.values():
            texts = [t.replace("CLASSNAME", n) for n in names for t in TEMPLATES]
            text = F.normalize(_authors_language_class(theirs, *_their_ids(tokenizer, texts),
                                                       heads=2), dim=-1)  # fmt: skip
            rows.append(text.mean(0))
        logits = 100.0 * F.normalize(image, dim=-1) @ torch.stack(rows).T
        want = torch.softmax(logits, dim=-1).numpy()
    got = read_tile_scores(path, "musk", "tissue")
    assert got["probabilities"].shape == (len(tiles), 3) and len(tiles) > 10
    np.testing.assert_allclose(got["probabilities"], want, atol=2e-5)
    record = got["record"]
    assert record["text_tower"] == "musk" and record["projected_here"]
    assert record["logit_scale"] == 100.0
    assert record["class_embedding"] == "mean of the prompts' unit embeddings"
    np.testing.assert_allclose(list(done.slide.values()), want.mean(axis=0), atol=2e-5)


def test_musk_text_state_of_the_authors_whole_checkpoint_loads_strictly():
    """Every tensor of the authors' MUSK state, as their code names and shapes it, on the
    meta device: the language half loads strictly into the full-size text module."""
    from tilestore.embed.models.musk import MuskText, musk_text_state

    theirs = {k: torch.empty(shape, device="meta") for k, shape in AUTHORS_KEYS["musk"].items()}
    with torch.device("meta"):
        text = MuskText()
    state = musk_text_state(theirs)
    text.load_state_dict(state, strict=True, assign=True)
    assert tuple(state["pos_embed"].shape) == (1, 1022, 1024)  # rows 2..1023
    assert tuple(state["embed.weight"].shape) == (64010, 1024)
    used = {k for k in theirs if ".B." in k} | {"beit3.text_embed.weight", "language_head.weight"}
    assert len(used) == 24 * 20 + 3 + 2 and set(theirs) - used >= {"vision_head.weight"}


def test_musk_without_its_tokenizer_or_its_text_half_is_one_line(musk_text, tmp_path):
    from tilestore.embed.models.text import load_text_tower

    folder, theirs = musk_text
    (folder / "tokenizer.spm").rename(tmp_path / "elsewhere.spm")
    with pytest.raises(
        ModelError,
        match=r"^musk: its tokenizer tokenizer.spm is not with the "
        r"weights .* github.com/lilab-stanford/MUSK, musk/models/tokenizer.spm\)$",
    ):
        load_text_tower(get_model("musk"), weights=folder)
    tower = load_text_tower(get_model("musk"), weights=folder, tokenizer=tmp_path / "elsewhere.spm")
    assert tower.embed(["tumor."]).shape == (1, 128)
    fc2 = theirs.pop("beit3.encoder.layers.1.ffn.B.fc2.weight")
    safetensors.torch.save_file(theirs, folder / "model.safetensors")
    with pytest.raises(ModelError, match=r"^musk: the text tower's weights do not fit: missing "
                       r"\['blocks\.1\.mlp\.fc2\.weight'\], unexpected \[\]$"):  # fmt: skip
        load_text_tower(get_model("musk"), weights=folder, tokenizer=tmp_path / "elsewhere.spm")
    theirs["beit3.encoder.layers.1.ffn.B.fc2.weight"] = fc2
    del theirs["language_head.weight"]
    safetensors.torch.save_file(theirs, folder / "model.safetensors")
    with pytest.raises(
        ModelError,
        match=r"^musk: .*model.safetensors holds no text tower "
        r"\(language_head.weight missing\)",
    ):
        load_text_tower(get_model("musk"), weights=folder, tokenizer=tmp_path / "elsewhere.spm")


def test_musk_tokenizer_gives_transformers_ids_and_refuses_its_special_tokens(
    musk_text, their_tokenizer
):
    from tilestore.embed.models.musk import XlmTokenizer

    folder, theirs = musk_text[0], their_tokenizer
    ours = XlmTokenizer(folder / "tokenizer.spm")
    texts = ["tumor.", "an H&E image of fibrous stroma.", "unseen words: xyzzy ümlaut 中文", LONG]
    ids, padding = ours(texts, 100)
    want, want_padding = _their_ids(theirs, texts)
    assert torch.equal(ids, want) and torch.equal(padding, want_padding.bool())
    assert (ids == XlmTokenizer.UNK).any()  # pieces the model lacks are <unk> on both sides
    with pytest.raises(ModelError, match=r"^musk: the prompt 'a <mask> here' holds '<mask>'"):
        ours(["a <mask> here"], 100)
