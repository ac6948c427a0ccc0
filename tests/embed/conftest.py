"""Fixtures for the embedder: private store copies and a Hugging Face cache built offline."""

from __future__ import annotations

import json
import shutil

import pytest
import safetensors.torch
import timm

from tests.conftest import CMU


@pytest.fixture
def store(tmp_path, stores):
    """A private copy of the converted CMU-1-Small-Region store."""

    def copy(name=CMU, into=None, **kwargs):
        target = (into or tmp_path) / f"{name}.ome.zarr"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(stores(name, **kwargs), target)
        return target

    return copy


TINY_REVISION = "0123456789abcdef0123456789abcdef01234567"


def write_checkpoint(folder, model, config: dict, weights_name: str) -> dict:
    """Write timm's config.json and the model's weights (safetensors or torch); return them."""
    import torch

    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if weights_name.endswith(".safetensors"):
        safetensors.torch.save_file(state, folder / weights_name)
    else:
        torch.save(state, folder / weights_name)
    return state


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An offline HF cache holding a tiny ViT in timm's hub format; returns (repo, weights)."""

    def build(
        repo="testorg/tiny-vit",
        arch="vit_tiny_patch16_224",
        model_args=None,
        weights_name="model.safetensors",
    ):
        model_args = model_args or {"depth": 2}
        model = timm.create_model(arch, pretrained=False, num_classes=0, **model_args)
        folder = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}"
        snapshot = folder / "snapshots" / TINY_REVISION
        snapshot.mkdir(parents=True)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(TINY_REVISION)
        config = {
            "architecture": arch,
            "num_classes": 0,
            "model_args": model_args,
            "pretrained_cfg": {
                "input_size": [3, 224, 224],
                "interpolation": "bicubic",
                "crop_pct": 1.0,
                "mean": [0.5, 0.5, 0.5],
                "std": [0.5, 0.5, 0.5],
            },
        }
        return repo, write_checkpoint(snapshot, model, config, weights_name)

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return build
