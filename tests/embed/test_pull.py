"""`models pull` for every registered Hub encoder: the files its spec names (repo, repo type,
weights file and folder, config.json where its family reads one) are fetched into the cache as
huggingface_hub lays it out, found there offline (`is_cached`, `models list`), and, for the
smaller encoders, loaded from it with HF_HUB_OFFLINE=1 by the real huggingface_hub.

The Hub is a stand-in: a folder per repo served by `list_repo_files` and a download that
writes what huggingface_hub writes (a blob named by its hash, a relative link to it in the
snapshot, refs/main); every offline read goes through huggingface_hub itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.embed.conftest import REVISION, FakeHub
from tilestore.embed.models import ModelError, hub, list_models, load_model
from tilestore.embed.models.families import build, open_clip_config, open_clip_text_repos

HUB_SPECS = [s for s in list_models() if s.source == "hf-hub"]


def _publish(fake: FakeHub, spec, weights: bytes = b"not read by pull") -> Path:
    folder = fake.repo(spec.repo, spec.repo_type)
    name = spec.weights_file or "model.safetensors"
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(weights)
    if spec.family == "transformers" or spec.arch is None:
        (folder / "config.json").write_text(json.dumps({"model_type": "x"}))
    for repo in _text_repos(spec):
        (fake.repo(repo) / "config.json").write_text(json.dumps({"model_type": "bert"}))
        (fake.repo(repo) / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return folder


def _text_repos(spec) -> tuple[str, ...]:
    """The Hugging Face repos an open_clip text tower is built from (BiomedCLIP's BERT)."""
    if spec.text != "open_clip":
        return ()
    return open_clip_text_repos(open_clip_config(spec, None))


@pytest.mark.parametrize("spec", HUB_SPECS, ids=lambda s: s.name)
def test_pull_fetches_what_the_spec_names_into_the_cache(fake_hub, spec, monkeypatch):
    assert not hub.is_cached(spec)
    _publish(fake_hub, spec)
    checkpoint = hub.pull(spec.name)
    weights = spec.weights_file or "model.safetensors"
    assert (spec.repo_type, spec.repo, weights) in fake_hub.asked
    assert checkpoint.revision == REVISION and checkpoint.repo == spec.repo
    assert checkpoint.weights.as_posix().endswith(f"snapshots/{REVISION}/{weights}")
    assert checkpoint.weights.read_bytes() == b"not read by pull"
    for repo in _text_repos(spec):  # BiomedCLIP's BERT: its config and vocabulary too
        assert {("model", repo, "config.json"), ("model", repo, "vocab.txt")} <= set(fake_hub.asked)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the compute node: found without the network
    assert hub.is_cached(spec)
    assert hub.fetch_spec(spec).weights == checkpoint.weights


def test_pull_refuses_a_repo_without_the_weights_file(fake_hub):
    spec = next(s for s in HUB_SPECS if s.name == "gpfm")
    (fake_hub.repo(spec.repo) / "other.pth").write_bytes(b"x")
    with pytest.raises(ModelError, match=r"^gpfm: majiabo/GPFM has none of GPFM.pth$"):
        hub.pull("gpfm")


def _state(spec) -> dict[str, torch.Tensor]:
    """Random weights of the spec's architecture in the layout its authors publish."""
    backbone = build(spec)
    state = {k: v.contiguous() for k, v in backbone.state_dict().items()}
    if spec.family == "conch":  # the whole CoCa checkpoint: the vision tower under visual.
        state = {f"visual.{k}": v for k, v in state.items()}
    return state


@pytest.mark.parametrize("name", ["kaiko-vits16", "lunit-vits8", "conch-v1", "chief-ctranspath"])
def test_pulled_encoders_load_offline_from_the_cache(fake_hub, name, tmp_path, monkeypatch):
    import safetensors.torch

    spec = next(s for s in HUB_SPECS if s.name == name)
    state = _state(spec)
    published = tmp_path / "w"
    if (spec.weights_file or "").endswith((".bin", ".pth")):
        torch.save({"model": state} if spec.family == "ctranspath" else state, published)
    else:
        safetensors.torch.save_file(state, published)
    _publish(fake_hub, spec, published.read_bytes())
    hub.pull(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model(name)
    assert loaded.output_dim == spec.output_dim and loaded.revision == REVISION
    assert "/snapshots/" in loaded.weights


def test_pull_fetches_timms_weights_of_an_architecture_which_then_load_offline(
    fake_hub, tmp_path, monkeypatch
):
    """timm:<arch> runs only with timm's weights in the cache (refused without them): pull
    fetches them, as for a registered model."""
    import safetensors.torch
    import timm

    repo = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # timm's weights of the arch
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)
    folder = fake_hub.repo(repo)
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    safetensors.torch.save_file(state, folder / "model.safetensors")
    checkpoint = hub.pull("timm:vit_tiny_patch16_224")
    assert checkpoint.repo == repo and ("model", repo, "model.safetensors") in fake_hub.asked
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("timm:vit_tiny_patch16_224")
    assert loaded.weights == str(checkpoint.weights) and loaded.weights_seed is None
    assert loaded.weights_sha256 == checkpoint.sha256
    with pytest.raises(ModelError, match=r"^timm:botnet50ts_256: timm publishes no pretrained"):
        hub.pull("timm:botnet50ts_256")
