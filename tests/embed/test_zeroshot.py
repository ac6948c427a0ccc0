"""Zero-shot classification of stored tiles: the prompts file checked at the door, each
image-text model's text tower built from its checkpoint and equal to its reference (random
weights in the authors' layout), the scores written beside the features and read back as
the per-tile columns the viewer shows."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import zarr

from tests.conftest import group_of
from tilestore import open_slide
from tilestore.embed.models import ModelError, get_model, load_model
from tilestore.embed.prompts import read_prompts
from tilestore.embed.zeroshot import ZeroShotOptions, class_embeddings, classify
from tilestore.embeddings import open_embeddings
from tilestore.embeddings.scores import read_tile_scores
from tilestore.embeddings.write import write_features
from tilestore.errors import EmbeddingError, OptionError, OtherWeights, StoreError
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan

transformers = pytest.importorskip("transformers")

WORDS = ["an", "h&e", "image", "of", "tumor", "stroma", "normal", "tissue", "carcinoma",
         "fibrous", "benign", "lymphocytes", "necrosis", ".", ",", "a", "photomicrograph",
         "showing"]  # fmt: skip
PROMPTS = {
    "classnames": {
        "tumor": ["tumor", "carcinoma"],
        "stroma": ["stroma", "fibrous stroma"],
        "normal": ["normal tissue", "benign tissue"],
    },
    "templates": ["an h&e image of CLASSNAME .", "a photomicrograph showing CLASSNAME ."],
}

ONE = {"tumor": ["tumor"], "stroma": ["fibrous stroma"], "normal": ["normal tissue"]}


def _prompts(tmp_path, data=PROMPTS, name="tissue.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# -- the prompts file ---------------------------------------------------------------------------


def test_a_prompts_file_in_conchs_own_form_is_read_with_its_classes_in_order(tmp_path):
    prompts = read_prompts(_prompts(tmp_path, {"0": PROMPTS}))
    assert prompts.names == ["tumor", "stroma", "normal"]
    assert prompts.texts("tumor")[:2] == [
        "an h&e image of tumor .",
        "a photomicrograph showing tumor .",
    ]
    assert len(prompts.texts("stroma")) == 4  # every name in every template


def test_a_yaml_prompts_file_without_templates_takes_each_name_as_a_prompt(tmp_path):
    path = _prompts(tmp_path, "classnames:\n  tumor: [a tumor]\n  normal: normal tissue\n",
                    name="p.yaml")  # fmt: skip
    prompts = read_prompts(path)
    assert prompts.texts("tumor") == ["a tumor"] and prompts.texts("normal") == ["normal tissue"]


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("p.txt", "tumor: [a]", "a .json, .yaml or .yml file"),
        ("p.json", "{not json", "not JSON"),
        ("p.yaml", "classnames: [a, b", "not YAML"),
        ("p.json", json.dumps({"classes": {}}), "needs a mapping with 'classnames'"),
        ("p.json", json.dumps({**PROMPTS, "extra": 1}), "unknown key(s) 'extra'"),
        ("p.json", json.dumps({"classnames": {"tumor": ["a"]}}), "at least two classes"),
        ("p.json", json.dumps({"classnames": {"a b": ["x"], "c": ["y"]}}), "is not a column name"),
        ("p.json", json.dumps({"classnames": {"a": [], "c": ["y"]}}), "class 'a' has no names"),
        ("p.json", json.dumps({"classnames": {"a": [3], "c": ["y"]}}), "a name that is not text"),
        ("p.json", json.dumps({**PROMPTS, "templates": ["no placeholder"]}),
         "does not hold CLASSNAME"),
    ],
)  # fmt: skip
def test_a_bad_prompts_file_is_one_line_naming_it(tmp_path, name, content, said):
    path = _prompts(tmp_path, content, name=name)
    with pytest.raises(OptionError, match=rf"^prompts='{path}': .*") as caught:
        read_prompts(path)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_prompts_file_is_one_line(tmp_path):
    with pytest.raises(OptionError, match=r"prompts='.*nothing.json': cannot read it"):
        read_prompts(tmp_path / "nothing.json")


def test_a_model_without_a_text_tower_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ModelError, match=r"model='uni' has no text tower; zero-shot takes .*plip"):
        classify([tmp_path / "never-read.ome.zarr"], "uni", _prompts(tmp_path))


def test_the_image_text_models_say_which_text_tower_they_take():
    want = {"plip": "clip", "conch-v1": "conch", "medsiglip": "siglip",
            "quiltnet-b32": "open_clip", "quiltnet-b16": "open_clip", "biomedclip": "open_clip",
            "omiclip": "open_clip", "keep": "keep", "musk": "musk"}  # fmt: skip
    assert {name: get_model(name).text for name in want} == want
    assert get_model("conch-v1.5").text is None  # its text half is not published


# -- checkpoints in the authors' layout, random weights -------------------------------------------


def _word_tokenizer(folder: Path, bos: str, eos: str, pad: str) -> None:
    """A small word-level tokenizer saved the way transformers reads one from a folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate([pad, bos, eos, "<unk>", *dict.fromkeys(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token="<unk>"
    )
    fast.save_pretrained(folder)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = 0.05 * torch.randn(tensor.shape, generator=generator)
            tensor.copy_(noise + (1.0 if name.endswith("norm.weight") or ".ln" in name else 0.0))


def _plip(folder: Path, seed: int = 1) -> transformers.CLIPModel:
    config = transformers.CLIPConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 224, "patch_size": 32},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "vocab_size": 64, "max_position_embeddings": 32,
                     "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        projection_dim=24,
    )  # fmt: skip
    model = transformers.CLIPModel(config).eval()
    _randomize(model, seed)
    model.logit_scale.data.fill_(np.log(30.0))
    model.save_pretrained(folder)
    _word_tokenizer(folder, "<|startoftext|>", "<|endoftext|>", "<pad>")
    return model


def _siglip(folder: Path) -> transformers.SiglipModel:
    config = transformers.SiglipConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 448, "patch_size": 56},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "vocab_size": 64, "max_position_embeddings": 16,
                     "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1},
    )  # fmt: skip
    model = transformers.SiglipModel(config).eval()
    _randomize(model, 2)
    model.logit_scale.data.fill_(np.log(10.0))
    model.logit_bias.data.fill_(-3.0)
    model.save_pretrained(folder)
    _word_tokenizer(folder, "<s>", "</s>", "<pad>")
    return model


def _embedded(store_path, name: str, folder: Path, plan: PlanOptions, crop: int, spec=None):
    """The store planned with `plan` and its tiles' features stored, made by `name` loaded
    from `folder` (our loader, the authors' layout) from real tiles: the level-0 `crop` px
    at each tile's corner. Returns (those tiles, the loaded model). spec: the registered
    entry, changed (a smaller architecture), with `folder` as its repo."""
    slide = open_slide(store_path)
    made = plan_over_tissue(slide, replace(plan, min_tissue=0.0, name="p"))
    save_plan(slide, made)
    pixels = np.moveaxis(slide.array(0)[:], 0, -1)
    tiles = np.stack(
        [pixels[y : y + crop, x : x + crop] for x, y in zip(made.x, made.y, strict=True)]
    )
    spec = spec or replace(get_model(name), source="local", repo=str(folder), output_dim=None)
    loaded = load_model(spec)
    with torch.inference_mode():
        features = loaded.features(loaded.transform(torch.from_numpy(tiles))).numpy()
    record = {**loaded.describe(), "name": name}
    write_features(store_path, record, features, plan="p")
    return tiles, loaded


def _reference_probabilities(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits, dim=-1).numpy()


@pytest.fixture
def plip_store(store, tmp_path):
    folder = tmp_path / "plip"
    clip = _plip(folder)
    path = store()
    tiles, loaded = _embedded(path, "plip", folder, PlanOptions(mpp="level0", tile=224), 224)
    return path, folder, clip, tiles, loaded


def test_plip_zero_shot_equals_transformers_clip_logits_on_real_tiles(plip_store, tmp_path):
    """One prompt per class: the class embedding is CLIP's text embedding, and the scores
    are CLIPModel's own logits_per_image, softmaxed, for the same real tiles."""
    path, folder, clip, tiles, loaded = plip_store
    one = {"classnames": ONE}
    prompts = _prompts(tmp_path, one, name="one.json")
    (done,) = classify([path], "plip", prompts, ZeroShotOptions(weights=folder, device="cpu"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(["tumor", "fibrous stroma", "normal tissue"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        pixels = loaded.transform(torch.from_numpy(tiles))
        want = _reference_probabilities(clip(**ids, pixel_values=pixels).logits_per_image)
    got = read_tile_scores(path, "plip", "one")
    np.testing.assert_allclose(got["probabilities"], want, atol=2e-5)
    assert got["record"]["slide_rule"] == "mean of the tile probabilities"
    np.testing.assert_allclose(list(done.slide.values()), want.mean(axis=0), atol=2e-5)
    assert done.path == f"{group_of(path, 'plip')}/zeroshot/one" and done.tiles == len(tiles)


def test_the_scores_are_per_tile_columns_of_the_embeddings_and_the_viewers(plip_store, tmp_path):
    path, folder, *_ = plip_store
    classify([path], "plip", _prompts(tmp_path), ZeroShotOptions(weights=folder, device="cpu"))
    ds = open_embeddings(path, "plip")
    probabilities = np.stack([ds[f"tissue:{c}"].values for c in ("tumor", "stroma", "normal")], 1)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    names = np.array(["tumor", "stroma", "normal"])[probabilities.argmax(axis=1)]
    assert (ds["tissue"].values == names).all()
    from tilestore.view import Catalog
    from tilestore.view.values import columns, tile_values

    catalog = Catalog([open_slide(path)], [str(path)], [str(path)])
    assert {"tissue", "tissue:tumor", "tissue:stroma", "tissue:normal"} <= set(
        columns(catalog, "plip")
    )
    heat = tile_values(catalog, "plip", 0, "tissue:tumor")
    np.testing.assert_allclose(heat.scalar, probabilities[:, 0], atol=1e-6)
    assert tile_values(catalog, "plip", 0, "tissue").names  # the classes, as a class overlay


def test_features_pooled_otherwise_or_from_random_weights_are_refused(plip_store, tmp_path):
    path, folder, _, _, loaded = plip_store
    features = open_embeddings(path, "plip").features.values
    options = ZeroShotOptions(weights=folder, device="cpu")
    for change, said in [({"pooling": "mean"}, "pooled 'mean'"),
                         ({"weights": "random"}, "random weights"),
                         ({"projection": None}, "with projection None")]:  # fmt: skip
        record = {**loaded.describe(), "name": "plip", **change}
        write_features(path, record, features, plan="p", overwrite=True)
        with pytest.raises(EmbeddingError, match=said):
            classify([path], "plip", _prompts(tmp_path), options)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_features_made_with_other_weights_are_refused_naming_both(plip_store, tmp_path):
    """Features of checkpoint A scored with the text tower of checkpoint B, both given as
    folders (no revision known): refused in one line naming the store, the model, both
    weights' sha256 and the fix; no scores written."""
    path, folder, *_ = plip_store
    other = tmp_path / "plip-other"
    _plip(other, seed=9)
    mine, theirs = _sha256(folder / "model.safetensors"), _sha256(other / "model.safetensors")
    assert mine != theirs
    options = ZeroShotOptions(weights=other, device="cpu")
    with pytest.raises(OtherWeights) as caught:
        classify([path], "plip", _prompts(tmp_path), options)
    said = str(caught.value)
    assert said == (
        f"{path}: plip's features were made with weights of sha256 {mine}, its text tower is "
        f"read from {other / 'model.safetensors'}, sha256 {theirs}: the two halves of one "
        "checkpoint are needed; embed the store again with model='plip' (overwrite=True) "
        "from that checkpoint, or read the text tower from the weights the features were "
        "made with (weights=<folder>)"
    )
    assert not any((Path(path) / "embeddings" / "plip").rglob("zeroshot"))


def _hub_cache(cache: Path, repo: str, files: Path, revision: str) -> Path:
    """The files of `files` as huggingface_hub caches a repo's commit: blobs named by their
    sha256, the snapshot's relative links to them, refs/main naming the commit."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (entry / "blobs").mkdir(exist_ok=True)
    for source in files.iterdir():
        blob = entry / "blobs" / _sha256(source)
        blob.write_bytes(source.read_bytes())
        (snapshot / source.name).symlink_to(os.path.relpath(blob, snapshot))
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(revision)
    return snapshot


def test_the_same_weights_are_accepted_under_another_revision_or_path(store, tmp_path, monkeypatch):
    """Which weights, not which commit or folder: features embedded from the Hub's cache at
    one commit are scored by the text tower of a later commit holding the same weights file,
    and by one read from a plain copy of it (no revision); the scores record the same sha256
    as the features, the sha256 of the file's bytes."""
    folder = tmp_path / "plip"
    _plip(folder)
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_cache(cache, "vinid/plip", folder, "a" * 40)
    path = store()
    spec = replace(get_model("plip"), output_dim=None)  # the tiny CLIP's width
    _embedded(path, "plip", folder, PlanOptions(mpp="level0", tile=224), 224, spec=spec)
    _hub_cache(cache, "vinid/plip", folder, "b" * 40)  # a later commit, the same weights
    classify([path], "plip", _prompts(tmp_path), ZeroShotOptions(device="cpu"))
    made = zarr.open_group(path, path=group_of(path, "plip"), mode="r").attrs["tilestore"]["model"]
    assert made["revision"] == "a" * 40
    assert made["weights_sha256"] == _sha256(folder / "model.safetensors")
    record = read_tile_scores(path, "plip", "tissue")["record"]
    assert record["revision"] == "b" * 40 and record["weights_sha256"] == made["weights_sha256"]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    classify([path], "plip", _prompts(tmp_path), ZeroShotOptions(weights=copy, device="cpu"))
    record = read_tile_scores(path, "plip", "tissue")["record"]
    assert record["revision"] is None and record["weights_sha256"] == made["weights_sha256"]


def test_features_that_do_not_record_their_weights_are_refused_with_the_fix(plip_store, tmp_path):
    """A group embedded before the weights' sha256 was recorded (or written by other code)
    cannot be matched to a text tower: refused, the fix named, rather than scored."""
    path, folder, _, _, loaded = plip_store
    features = open_embeddings(path, "plip").features.values
    record = {k: v for k, v in loaded.describe().items() if k != "weights_sha256"}
    write_features(path, {**record, "name": "plip"}, features, plan="p", overwrite=True)
    with pytest.raises(OtherWeights) as caught:
        classify([path], "plip", _prompts(tmp_path), ZeroShotOptions(weights=folder, device="cpu"))
    assert str(caught.value) == (
        f"{path}: plip's features do not record which weights made them (no weights_sha256: "
        "embedded before it was recorded, or elsewhere), so they cannot be matched to the "
        f"text tower's ({folder / 'model.safetensors'}, sha256 "
        f"{_sha256(folder / 'model.safetensors')}); embed the store again with model='plip' "
        "(overwrite=True), with the checkpoint the text tower is read from"
    )


def test_features_of_another_width_are_refused(plip_store, tmp_path):
    path, folder, _, _, loaded = plip_store
    features = open_embeddings(path, "plip").features.values[:, :20]
    write_features(path, {**loaded.describe(), "name": "plip", "output_dim": 20}, features,
                   plan="p", overwrite=True)  # fmt: skip
    with pytest.raises(EmbeddingError, match=r"20-d, its text embeddings 24-d"):
        classify([path], "plip", _prompts(tmp_path), ZeroShotOptions(weights=folder, device="cpu"))


def test_a_cohort_with_one_store_refused_writes_no_store_s_scores(plip_store, store, tmp_path):
    """Every store is checked before any is scored: a cohort whose second store holds no
    features of the model is refused whole, and the first store is left without scores
    (it was scored, then the second refused)."""
    path, folder, *_ = plip_store
    options = ZeroShotOptions(weights=folder, device="cpu")
    with pytest.raises(StoreError, match=r"no embeddings/plip"):
        classify([path, store(into=tmp_path / "other")], "plip", _prompts(tmp_path), options)
    assert not any((Path(path) / "embeddings" / "plip").rglob("zeroshot"))


def test_a_store_without_the_models_features_is_refused(store, tmp_path):
    folder = tmp_path / "plip"
    _plip(folder)
    with pytest.raises(StoreError, match=r"no embeddings/plip"):
        classify(
            [store()], "plip", _prompts(tmp_path), ZeroShotOptions(weights=folder, device="cpu")
        )


def test_a_checkpoint_without_its_tokenizer_is_one_line(plip_store, tmp_path):
    path, folder, *_ = plip_store
    for tokenizer_file in folder.glob("tokenizer*"):
        tokenizer_file.unlink()
    with pytest.raises(ModelError, match=r"plip: no tokenizer beside its weights in "):
        classify([path], "plip", _prompts(tmp_path), ZeroShotOptions(weights=folder, device="cpu"))


def test_medsiglip_zero_shot_equals_transformers_siglip_logits_on_real_tiles(store, tmp_path):
    """SigLIP's text padded to its context, its bias in the logits: the scores are
    SiglipModel's logits_per_image softmaxed over the classes (as MedSigLIP's card does)."""
    folder = tmp_path / "medsiglip"
    siglip = _siglip(folder)
    path = store()
    tiles, loaded = _embedded(path, "medsiglip", folder, PlanOptions(mpp="level0", tile=448), 448)
    one = {"classnames": ONE}
    classify([path], "medsiglip", _prompts(tmp_path, one, name="one.json"),
             ZeroShotOptions(weights=folder, device="cpu"))  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(["tumor", "fibrous stroma", "normal tissue"], padding="max_length",
                    max_length=16, return_tensors="pt")  # fmt: skip
    with torch.inference_mode():
        pixels = loaded.transform(torch.from_numpy(tiles))
        out = siglip(input_ids=ids["input_ids"], pixel_values=pixels)
        want = _reference_probabilities(out.logits_per_image)
        image = siglip.get_image_features(pixel_values=pixels)
        image = getattr(image, "pooler_output", image)
        np.testing.assert_allclose(loaded.features(pixels), image, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(read_tile_scores(path, "medsiglip", "one")["probabilities"], want,
                               atol=2e-5)  # fmt: skip


# -- CONCH v1: checked against the authors' own package, where it is at hand ----------------------


def _conch_package():
    """CONCH's package (github.com/mahmoodlab/CONCH): installed, or a copy named by
    TILESTORE_CONCH; the test skips without it."""
    if os.environ.get("TILESTORE_CONCH"):
        sys.path.insert(0, os.environ["TILESTORE_CONCH"])
    coca = pytest.importorskip("conch.open_clip_custom.coca_model")
    custom = pytest.importorskip("conch.open_clip_custom.custom_tokenizer")
    return coca, custom


def test_conch_zero_shot_equals_the_authors_coca_on_real_tiles(store, tmp_path):
    """CONCH's CoCa with random weights saved whole (pytorch_model.bin, as the Hub has it):
    our text tower, class embeddings (its prompt ensembling over names and templates) and
    tile scores (the stored pooled features projected, as its MI-Zero code does) equal its
    own ``zero_shot_classifier`` and ``encode_image`` on real tiles."""
    coca, custom = _conch_package()
    from conch.downstream.zeroshot_path import zero_shot_classifier

    config = json.loads(
        (Path(coca.__file__).parent / "model_configs" / "conch_ViT-B-16.json").read_text()
    )
    config.pop("custom_text")
    config["multimodal_cfg"]["layers"] = 0  # no captioning decoder: zero-shot never reads it
    model = coca.CoCa(**config).eval()
    _randomize(model, 3)
    folder = tmp_path / "conch"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    path = store()
    tiles, loaded = _embedded(path, "conch-v1", folder, PlanOptions(mpp=2.0, tile=448), 448)
    classify([path], "conch-v1", _prompts(tmp_path), ZeroShotOptions(weights=folder, device="cpu"))
    tokenizer = custom.get_tokenizer()
    if not hasattr(tokenizer, "batch_encode_plus"):  # transformers 5 dropped the name
        tokenizer.batch_encode_plus = tokenizer.__call__
    names = [PROMPTS["classnames"][c] for c in ("tumor", "stroma", "normal")]
    with torch.inference_mode():
        theirs = zero_shot_classifier(model, names, PROMPTS["templates"], tokenizer, "cpu")
        pixels = loaded.transform(torch.from_numpy(tiles))
        image = model.encode_image(pixels, normalize=True, proj_contrast=True)
        want = _reference_probabilities(model.logit_scale.exp() * image @ theirs)
    from tilestore.embed.models.text import load_text_tower

    ours = class_embeddings(load_text_tower(get_model("conch-v1"), weights=folder), read_prompts(
        _prompts(tmp_path)))  # fmt: skip
    torch.testing.assert_close(ours, theirs.T, atol=1e-6, rtol=1e-5)
    got = read_tile_scores(path, "conch-v1", "tissue")["probabilities"]
    np.testing.assert_allclose(got, want, atol=2e-5)


# -- QuiltNet: open_clip's CLIP, its own loading as the reference --------------------------------

TINY_CLIP = {
    "embed_dim": 24,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "patch_size": 32, "head_width": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2},
}


def test_quiltnet_zero_shot_equals_open_clips_own_loading_on_real_tiles(store, tmp_path):
    """A small CLIP in QuiltNet's layout (open_clip_pytorch_model.bin and the repo's
    open_clip_config.json): open_clip's create_model(pretrained=FILE) and tokenizer give the
    reference image embeddings and logits; ours stores the same features and scores."""
    open_clip = pytest.importorskip("open_clip")
    folder = tmp_path / "quiltnet"
    folder.mkdir()
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "tiny-quilt.json").write_text(json.dumps(TINY_CLIP))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP}))
    made = open_clip.model.CLIP(**TINY_CLIP).eval()
    _randomize(made, 4)
    torch.save(made.state_dict(), folder / "open_clip_pytorch_model.bin")
    open_clip.add_model_config(configs)
    theirs = open_clip.create_model(
        "tiny-quilt", pretrained=str(folder / "open_clip_pytorch_model.bin")
    )
    theirs = theirs.eval()
    path = store()
    tiles, loaded = _embedded(
        path, "quiltnet-b32", folder, PlanOptions(mpp="level0", tile=224), 224
    )
    classify([path], "quiltnet-b32", _prompts(tmp_path, {"classnames": ONE}, name="one.json"),
             ZeroShotOptions(weights=folder, device="cpu"))  # fmt: skip
    tokenizer = open_clip.get_tokenizer("tiny-quilt")
    with torch.inference_mode():
        pixels = loaded.transform(torch.from_numpy(tiles))
        image = theirs.encode_image(pixels)
        torch.testing.assert_close(loaded.features(pixels), image, atol=1e-5, rtol=1e-5)
        text = theirs.encode_text(tokenizer(["tumor", "fibrous stroma", "normal tissue"]))
        cosine = F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
        want = _reference_probabilities(theirs.logit_scale.exp() * cosine)
    got = read_tile_scores(path, "quiltnet-b32", "one")["probabilities"]
    np.testing.assert_allclose(got, want, atol=2e-5)


# -- OmiCLIP: open_clip's CoCa from a training run's checkpoint, open_clip's loading the reference

TINY_COCA = {
    "embed_dim": 24,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "patch_size": 32, "head_width": 8,
                   "attentional_pool": True, "attn_pooler_heads": 4, "output_tokens": True},
    "text_cfg": {"context_length": 76, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2,
                 "embed_cls": True, "output_tokens": True},
    "multimodal_cfg": {"context_length": 76, "vocab_size": 49408, "width": 32, "heads": 4,
                       "layers": 1, "attn_pooler_heads": 4},
    "custom_text": True,
}  # fmt: skip


def test_omiclip_features_and_zero_shot_equal_open_clips_loading_of_its_checkpoint(store, tmp_path):
    """A small CoCa in OmiCLIP's layout: a training run's checkpoint.pt (the state dict under
    ``state_dict`` with DDP's ``module.``, the run's argparse options and a numpy loss beside
    it), loaded by open_clip's create_model_from_pretrained as Loki's `load_model` does
    (LazySlide passes weights_only=False for it): the unit image embedding CoCa's
    encode_image gives, and its text tower's probabilities, are ours."""
    import argparse

    open_clip = pytest.importorskip("open_clip")
    folder, configs = tmp_path / "omiclip", tmp_path / "configs"
    folder.mkdir()
    configs.mkdir()
    (configs / "tiny-coca.json").write_text(json.dumps(TINY_COCA))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_COCA}))
    made = open_clip.coca_model.CoCa(**{k: v for k, v in TINY_COCA.items() if k != "custom_text"})
    _randomize(made.eval(), 5)
    run = {"epoch": 30, "name": "loki", "loss": np.float64(0.7),
           "args": argparse.Namespace(lr=1e-5)}  # fmt: skip
    state = {f"module.{k}": v for k, v in made.state_dict().items()}
    torch.save({**run, "state_dict": state}, folder / "checkpoint.pt")
    open_clip.add_model_config(configs)
    theirs, _ = open_clip.create_model_from_pretrained(
        "tiny-coca", pretrained=str(folder / "checkpoint.pt"), weights_only=False
    )
    theirs = theirs.eval()
    path = store()
    tiles, loaded = _embedded(path, "omiclip", folder, PlanOptions(mpp="level0", tile=224), 224)
    assert loaded.output_dim == 24
    classify([path], "omiclip", _prompts(tmp_path, {"classnames": ONE}, name="one.json"),
             ZeroShotOptions(weights=folder, device="cpu"))  # fmt: skip
    tokenizer = open_clip.get_tokenizer("tiny-coca")
    with torch.inference_mode():
        pixels = loaded.transform(torch.from_numpy(tiles))
        image = theirs.encode_image(pixels)  # CoCa's default: unit length
        torch.testing.assert_close(loaded.features(pixels), image, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(image.norm(dim=-1), torch.ones(len(tiles)))
        text = theirs.encode_text(tokenizer(["tumor", "fibrous stroma", "normal tissue"]))
        want = _reference_probabilities(theirs.logit_scale.exp() * image @ text.T)
    got = read_tile_scores(path, "omiclip", "one")["probabilities"]
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_a_hub_blob_is_named_by_its_sha256_through_the_shared_store_links(tmp_path, monkeypatch):
    """huggingface_hub's shared Xet store links a repo's blob on to a file named by its own
    hash: the sha256 is the repo's blob's name, found without reading the file; a file
    outside the cache is read."""
    import hashlib

    from tilestore.embed.models.hub import weights_sha256

    data = b"weights" * 1000
    sha = hashlib.sha256(data).hexdigest()
    stored = tmp_path / "xet" / "ab" / ("c" * 40)
    stored.parent.mkdir(parents=True)
    stored.write_bytes(data)
    entry = tmp_path / "hub" / "models--org--m"
    (entry / "blobs").mkdir(parents=True)
    (entry / "blobs" / sha).symlink_to(stored)  # absolute, as the shared store links it
    snapshot = entry / "snapshots" / ("1" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(os.path.relpath(entry / "blobs" / sha, snapshot))
    plain = tmp_path / "model.safetensors"
    plain.write_bytes(data)
    read = []
    digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, n: read.append(f.name) or digest(f, n))
    assert weights_sha256(snapshot / "model.safetensors") == sha and read == []
    assert weights_sha256(plain) == sha and read == [str(plain)]
