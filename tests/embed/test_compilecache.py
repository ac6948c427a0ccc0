"""The compile cache's entries: keyed, checked before use, replaced when bad, never trusted
blindly. torch's artifact functions are stood in for here; tests/embed/test_engine.py runs
the real ones through a compiled run."""

from __future__ import annotations

import json

import pytest
import torch

from tilestore.embed.compilecache import CompileCache, cache_key

MODEL = {"name": "timm:vit_tiny", "repo": None, "revision": None, "weights": "w", "transform": {}}


@pytest.fixture
def artifacts(monkeypatch):
    loaded = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"compiled graphs", {}))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data))
    return loaded


def test_saved_then_loaded_by_the_next_process(tmp_path, artifacts):
    key = cache_key(MODEL, 64, 224, "bf16", "cpu")
    first = CompileCache(tmp_path, key)
    assert first.load() == f"compile cache: none yet at {tmp_path}"
    assert first.save().startswith(f"compile cache: saved {first.path}")
    sidecar = json.loads(first.sidecar.read_text())
    assert sidecar["key"] == key and sidecar["bytes"] == len(b"compiled graphs")
    second = CompileCache(tmp_path, key)
    assert second.load().startswith(f"compile cache: loaded {first.path}")
    assert artifacts == [b"compiled graphs"] and second.save() is None  # nothing new


def test_other_shapes_precision_or_software_are_other_entries(tmp_path, artifacts):
    base = cache_key(MODEL, 64, 224, "bf16", "cpu")
    CompileCache(tmp_path, base).save()
    for other in (
        cache_key(MODEL, 128, 224, "bf16", "cpu"),
        cache_key(MODEL, 64, 256, "bf16", "cpu"),
        cache_key(MODEL, 64, 224, "fp32", "cpu"),
        {**base, "torch": "2.0.0"},
        {**base, "model": {**MODEL, "weights": "other"}},
    ):
        assert CompileCache(tmp_path, other).load().startswith("compile cache: none yet")
    assert torch.__version__ == base["torch"] and base["input"] == [64, 224, 224, 3]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda c: c.path.write_bytes(b"other bytes"), "its bytes changed since written"),
        (lambda c: c.sidecar.write_text("{"), "unreadable"),
        (
            lambda c: c.sidecar.write_text(json.dumps({"key": {"model": "x"}, "sha256": ""})),
            "made for another model, shape or software",
        ),
    ],
)
def test_a_bad_entry_is_ignored_with_a_note_and_replaced(tmp_path, artifacts, damage, why):
    key = cache_key(MODEL, 64, 224, "bf16", "cpu")
    CompileCache(tmp_path, key).save()
    damage(CompileCache(tmp_path, key))
    cache = CompileCache(tmp_path, key)
    assert why in cache.load() and artifacts == [] and not cache.loaded
    assert cache.save().startswith("compile cache: saved")  # the next run's entry is good
    assert CompileCache(tmp_path, key).load().startswith("compile cache: loaded")


def test_an_entry_torch_refuses_is_ignored(tmp_path, monkeypatch, artifacts):
    key = cache_key(MODEL, 64, 224, "bf16", "cpu")
    CompileCache(tmp_path, key).save()

    def refuse(data):
        raise RuntimeError("artifacts of another torch build")

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", refuse)
    note = CompileCache(tmp_path, key).load()
    assert "ignored (torch refused it: artifacts of another torch build)" in note
