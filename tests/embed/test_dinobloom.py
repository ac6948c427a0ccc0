"""DinoBloom-S: weights published as one file on Zenodo, pinned by their sha256 in the
catalogue, fetched once into tilestore's cache and checked at every load; a DINOv2 training
checkpoint's teacher backbone read into timm's ViT-S/14 at 224 px."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import timm
import torch

from tilestore.embed.models import get_model, load_model
from tilestore.embed.models.files import pinned_path
from tilestore.embed.models.hub import is_cached
from tilestore.errors import ModelError


def _authors_checkpoint(path: Path) -> torch.nn.Module:
    """A random DINOv2 ViT-S/14 (224 px, 257 positions) saved as DINOv2's training saves
    its teacher ({"teacher": {"backbone.<name>": ..., "dino_head.<name>": ...}}: DINOv2's
    own names, which timm's ViT shares for this size, with the mask token and the heads
    DinoBloom's loader drops); the timm model it was drawn as."""
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch14_dinov2", img_size=224, num_classes=0).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    teacher = {f"backbone.{k}": v for k, v in model.state_dict().items()}
    teacher["backbone.mask_token"] = torch.zeros(1, 384)
    teacher["dino_head.mlp.0.weight"] = torch.ones(8, 384)
    teacher["ibot_head.mlp.0.weight"] = torch.ones(8, 384)
    torch.save({"teacher": teacher}, path)
    return model


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILESTORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def served(tmp_path):
    """A local HTTP server of a folder: (its folder, its base URL)."""
    folder = tmp_path / "zenodo"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_dinobloom_is_registered_pinned_to_its_zenodo_file():
    spec = get_model("dinobloom-s")
    assert spec.source == "url" and spec.repo.startswith("https://zenodo.org/records/10908163/")
    assert spec.sha256 == "c2f7990b003e89bcece80e379fb8fe0ba2ec392ce19b286e8a294abd99568e44"
    assert (spec.output_dim, spec.pooling, spec.arch.name) == (
        384,
        "cls",
        "vit_small_patch14_dinov2",
    )
    with pytest.raises(ValueError, match="pins its file's sha256"):
        replace(spec, sha256="nope")


def test_fetched_once_checked_and_its_teacher_backbone_is_the_model(cache, served):
    folder, base = served
    model = _authors_checkpoint(folder / "DinoBloom-S.pth")
    spec = replace(get_model("dinobloom-s"), repo=f"{base}/DinoBloom-S.pth",
                   sha256=_digest(folder / "DinoBloom-S.pth"))  # fmt: skip
    assert not is_cached(spec)
    loaded = load_model(spec)
    assert is_cached(spec) and pinned_path(spec).is_relative_to(cache)
    assert loaded.weights_sha256 == spec.sha256
    tiles = torch.rand(3, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(loaded.module(tiles), model(tiles))  # the class token after the norm
    (folder / "DinoBloom-S.pth").unlink()  # the server's copy gone: the cache's is read
    with torch.inference_mode():
        assert torch.equal(load_model(spec).module(tiles), model(tiles))


def test_a_file_changed_in_the_cache_or_on_the_server_is_refused_in_one_line(cache, served):
    folder, base = served
    _authors_checkpoint(folder / "DinoBloom-S.pth")
    pinned = _digest(folder / "DinoBloom-S.pth")
    spec = replace(get_model("dinobloom-s"), repo=f"{base}/DinoBloom-S.pth", sha256=pinned)
    load_model(spec)
    path = pinned_path(spec)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1  # one byte changed in the cached copy
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError) as caught:
        load_model(spec)
    said = str(caught.value)
    assert f"{path} is not the file pinned" in said and f"pinned {pinned}" in said
    assert "\n" not in said
    path.unlink()
    (folder / "DinoBloom-S.pth").write_bytes(bytes(data))  # the server's file is another
    with pytest.raises(
        ModelError,
        match=rf"gave a file whose sha256 is [0-9a-f]{{64}}, not the pinned {pinned}: not used",
    ):
        load_model(spec)
    assert not path.exists() and not list(path.parent.glob(".*part"))  # nothing kept


def test_offline_or_unreachable_says_where_the_file_goes(cache, monkeypatch, tmp_path):
    spec = replace(get_model("dinobloom-s"), repo="http://127.0.0.1:9/DinoBloom-S.pth")
    with pytest.raises(ModelError, match=r"cannot fetch http://127\.0\.0\.1:9/DinoBloom-S\.pth"):
        load_model(spec)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as caught:
        load_model(spec)
    said = str(caught.value)
    assert "its weights are not in the cache" in said and str(pinned_path(spec)) in said
    assert "tilestore models pull dinobloom-s" in said and spec.sha256 in said
