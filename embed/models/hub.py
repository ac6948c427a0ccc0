"""Hugging Face Hub access for model weights: explicit token, offline cache, safe formats.

The token comes from the caller (hf_token), else HF_TOKEN or the token `huggingface-cli login`
stored (huggingface_hub's own lookup); we never log in and never write it anywhere.
HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE are read when a model is loaded, not when the
package is imported, so setting them in a notebook or a job script works. Weights are
read from safetensors, or from a torch file with weights_only=True; never a full pickle.

Before a download, one request with a short timeout and no retries asks whether the Hub
answers at all: huggingface_hub retries an unreachable Hub for about 25 s a file, then says
only that a file is missing. Without a network the cache is used, else one line says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import pickle
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import urlparse

import safetensors.torch
import torch
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)
from safetensors import SafetensorError

from tilestore.embed.models.files import fetch_pinned, pinned_path
from tilestore.embed.models.registry import get_model, timm_weights_repo
from tilestore.embed.models.spec import TOKENIZER_IN_REPO, ModelSpec
from tilestore.errors import ModelError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# a config's file by its format, where it is not config.json (open_clip's Hub repos)
CONFIG_FILES = {"open_clip": "open_clip_config.json"}
# a transformers tokenizer's files (each optional: a repo has those of its tokenizer's kind),
# fetched beside the weights of a model with a text tower
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "vocab.txt",
)
# seconds the one request asking whether the Hub answers may take: a HEAD answered by
# huggingface.co takes well under a second; a refused or unresolved host fails at once
PROBE_TIMEOUT = 5.0


@dataclass(frozen=True)
class Checkpoint:
    """A timm-format model folder: its config and weights file, and where they came from."""

    config: dict
    weights: Path
    repo: str
    revision: str | None  # the commit the files belong to, for the record

    @cached_property
    def sha256(self) -> str:
        """The weights file's identity (`weights_sha256`), found once."""
        return weights_sha256(self.weights)


# the name huggingface_hub's cache gives a large file's blob: its LFS object id, the sha256
# of its bytes (small files' blobs are named by their git sha1, 40 digits)
_LFS_BLOB = re.compile(r"[0-9a-f]{64}")


def weights_sha256(path: Path) -> str:
    """The sha256 of a weights file's bytes: what says which weights were loaded, wherever
    they were loaded from (a revision is known only in the Hub's cache, a path only on one
    machine). A file in the Hub's cache is named by it already (its blob); any other is read,
    at each load (about 1 s a GB: a folder of weights, `local:`)."""
    if (name := _blob_name(path)) is not None:
        return name
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except OSError as exc:
        raise ModelError(f"cannot read weights {path} ({exc.strerror or exc})") from exc


def _blob_name(path: Path, hops: int = 8) -> str | None:
    """The sha256 a Hub cache's blob is named by, following the snapshot's links one at a
    time: huggingface_hub's shared Xet store links a repo's blob on to a file named by its
    own hash, so where the last link lands says nothing."""
    for _ in range(hops):
        if path.parent.name == "blobs" and _LFS_BLOB.fullmatch(path.name):
            return path.name
        if not path.is_symlink():
            return None
        path = path.parent / os.readlink(path)  # an absolute link replaces the parent
    return None


def cache_dir() -> Path:
    """The hub cache, as HF_HUB_CACHE or HF_HOME say now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home) / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch(
    name: str,
    repo: str,
    *,
    token: str | None = None,
    revision: str | None = None,
    cached_only: bool = False,
    config: str | None = "timm",
    config_required: bool = True,
    weights: tuple[str, ...] = WEIGHT_FILES,
    repo_type: str = "model",
) -> Checkpoint:
    """Return the checkpoint of a hub repo, from the cache or (online) downloaded into it.

    config: the config.json's format ("timm", "transformers"), or None where the model's
    family reads none; config_required: False where the registry gives the architecture
    and a repo may publish its weights alone; weights: the weights files to try, in order."""
    local = cached_only or offline()
    # why the Hub cannot be reached, where it cannot: then only the cache is asked
    down = None if local else _hub_down(repo, weights[0], token, revision, repo_type)
    where = dict(
        token=token,
        revision=revision,
        cached_only=local or down is not None,
        down=down,
        repo_type=repo_type,
    )
    config_path = None
    if config:
        with contextlib.suppress(_Missing):  # optional, and absent
            config_path = _download(
                name, repo, CONFIG_FILES.get(config, "config.json"), **where,
                optional=not config_required,
            )  # fmt: skip
    found = None
    for filename in weights:
        try:
            found = _download(name, repo, filename, **where)
            break
        except _Missing:
            continue
    if found is None:
        if local or down is not None:
            raise ModelError(_not_cached(name, repo, down))
        raise ModelError(f"{name}: {repo} has none of {', '.join(weights)}")
    snapshot = (config_path or found).parent
    while snapshot.parent.name != "snapshots" and snapshot.parent != snapshot:
        snapshot = snapshot.parent  # a weights file in a folder of the repo
    revision_found = snapshot.name if snapshot.parent.name == "snapshots" else revision
    read = _read_config(name, config_path, config) if config_path else {}
    return Checkpoint(read, found, repo, revision_found)


def fetch_spec(spec: ModelSpec, *, token: str | None = None, cached_only: bool = False):
    """A registered model's checkpoint: the files its family reads, from its repo."""
    from tilestore.embed.models.families import family

    config = family(spec).config if spec.arch is None or spec.arch.config else None
    return fetch(
        spec.name,
        spec.repo,
        token=token,
        cached_only=cached_only,
        config=config,
        config_required=config == "transformers" or spec.arch is None,
        weights=(spec.weights_file,) if spec.weights_file else WEIGHT_FILES,
        repo_type=spec.repo_type,
    )


def fetch_tokenizer(spec: ModelSpec, *, token: str | None = None) -> list[Path]:
    """The tokenizer files a model's repo has (`TOKENIZER_FILES`), from the cache or (online)
    downloaded into it beside its weights; those it lacks are left out."""
    local = offline()
    down = None if local else _hub_down(spec.repo, "config.json", token, None, spec.repo_type)
    found = []
    for filename in TOKENIZER_FILES:
        with contextlib.suppress(_Missing):
            found.append(
                _download(
                    spec.name,
                    spec.repo,
                    filename,
                    token=token,
                    revision=None,
                    cached_only=local or down is not None,
                    down=down,
                    repo_type=spec.repo_type,
                    optional=True,
                )
            )
    return found


def fetch_text_model(name: str, repo: str, *, token: str | None = None) -> Path:
    """The folder of a second repo that a model's text tower is built from (BiomedCLIP's
    BERT, named by its open_clip_config.json): its config.json and tokenizer files, from the
    cache or (online) downloaded into it. Offline without them: one line naming the repo
    and `tilestore models pull <name>`."""
    local = offline()
    down = None if local else _hub_down(repo, "config.json", token, None, "model")
    where = dict(token=token, revision=None, cached_only=local or down is not None, down=down)
    try:
        config = _download(name, repo, "config.json", **where)
    except _Missing as exc:
        raise ModelError(
            f"{name}: {repo} has no config.json, which its text tower is built from"
        ) from exc
    for filename in TOKENIZER_FILES:
        with contextlib.suppress(_Missing):
            _download(name, repo, filename, **where, optional=True)
    return config.parent


def local(name: str, folder: str | os.PathLike, spec: ModelSpec | None = None) -> Checkpoint:
    """Return the checkpoint in a local folder: a config.json where the model's family reads
    one (timm's, for ``local:<dir>``) and its weights file."""
    from tilestore.embed.models.families import family

    folder = Path(folder)
    config = family(spec).config if spec else "timm"
    if spec and spec.arch and not spec.arch.config:
        config = None
    required = config == "transformers" or spec is None or spec.arch is None
    config_file = folder / CONFIG_FILES.get(config, "config.json")
    if not config_file.is_file():
        config = config if required else None
    if config and not config_file.is_file():
        raise ModelError(
            f"{name}: {folder} has no {config_file.name}"
            + (
                " (timm format: architecture, model_args, pretrained_cfg)"
                if config == "timm"
                else ""
            )
        )
    named = (Path(spec.weights_file).name,) if spec and spec.weights_file else ()
    for filename in (*named, *WEIGHT_FILES, "model.pth", "pytorch_model.pth"):
        if (folder / filename).is_file():
            read = _read_config(name, config_file, config) if config else {}
            return Checkpoint(read, folder / filename, str(folder), None)
    raise ModelError(f"{name}: {folder} has no {' or '.join((*named, *WEIGHT_FILES))}")


# what a training checkpoint holds beside its tensors that torch's weights_only loader does
# not take by itself, each only data when rebuilt (no code of the file's choosing runs):
# numpy's scalars, dtypes and arrays (a loss, a step), a run's argparse options. By the name
# the pickle gives (numpy 1's and 2's module paths) -> where it is now.
INERT_GLOBALS = {
    "numpy.core.multiarray.scalar": ("numpy._core.multiarray", "scalar"),
    "numpy._core.multiarray.scalar": ("numpy._core.multiarray", "scalar"),
    "numpy.core.multiarray._reconstruct": ("numpy._core.multiarray", "_reconstruct"),
    "numpy._core.multiarray._reconstruct": ("numpy._core.multiarray", "_reconstruct"),
    "numpy.ndarray": ("numpy", "ndarray"),
    "numpy.dtype": ("numpy", "dtype"),
    "argparse.Namespace": ("argparse", "Namespace"),
}


def _inert(found: str) -> tuple[object, str] | None:
    """The object the pickle's global `found` names, where it is inert data, with the name."""
    where = INERT_GLOBALS.get(found)
    if where is None:
        return None
    return getattr(importlib.import_module(where[0]), where[1]), found


def _torch_load(name: str, path: Path, device: torch.device | str):
    """torch.load with weights_only=True, taking also the inert data a training checkpoint
    keeps beside its tensors (`INERT_GLOBALS`); anything else a pickle would build is refused
    by name, before any of it is built. The pickle's globals are listed first (its small
    data.pkl, no tensor read), so a checkpoint is read once."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (RuntimeError, ValueError, OSError, pickle.UnpicklingError):
        found = []  # not torch's zip format (a bare pickle): torch's own refusal judges it
    allowed = [_inert(g) for g in found]
    refused = [g for g, ok in zip(found, allowed, strict=True) if ok is None]
    if refused:
        raise ModelError(
            f"{name}: cannot read weights {path} safely: its pickle would build "
            f"{', '.join(refused)}; only tensors and plain data are accepted"
        )
    if any(g.startswith("numpy") for g in found):  # a dtype's class, met when rebuilt
        allowed += _numpy_dtype_classes()
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location=device, weights_only=True)


def _numpy_dtype_classes() -> list[type]:
    """numpy 2's dtype classes (numpy.dtypes.Float64DType...): a dtype is rebuilt through
    its class, which the scan of a pickle's globals does not list."""
    import numpy.dtypes

    return [c for c in vars(numpy.dtypes).values() if isinstance(c, type)]


def load_weights(
    name: str, path: Path, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Read a state dict onto `device`: safetensors (straight into that device's memory, no
    copy of the whole checkpoint in host memory first), or torch.load with
    weights_only=True (no code runs; a training checkpoint's numpy scalars and argparse
    options are taken as the data they are: `INERT_GLOBALS`)."""
    try:
        if path.suffix == ".safetensors":
            return safetensors.torch.load_file(path, device=str(device))
        state = _torch_load(name, path, device)
    except (
        pickle.UnpicklingError,
        SafetensorError,
        RuntimeError,
        OSError,
        ValueError,
        EOFError,
    ) as exc:
        raise ModelError(
            f"{name}: cannot read weights {path} safely ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}); only tensors are accepted"
        ) from exc
    # {"model": state}: CTransPath's, CHIEF's; {"model_state_dict": state, "optimizer...": ...}:
    # a training checkpoint (iSight's)
    for wrapper in ("model_state_dict", "state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    state = _flattened(state)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"{name}: {path} is not a plain state dict of tensors")
    return state


def _flattened(state):
    """A checkpoint of several modules ({"encoder": {name: tensor}, "config": {...}}: MOOZY's)
    as one state dict, "encoder.name"; its plain values (numbers, text, flags: a config) left
    out. Anything else is kept as found, for the check that follows."""
    if not isinstance(state, dict) or not any(isinstance(v, dict) for v in state.values()):
        return state
    return dict(_leaves(state, ""))


def _leaves(tree: dict, prefix: str):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        elif not _plain(value):
            yield f"{prefix}{key}", value


def _plain(value) -> bool:
    """A config's value: a number, text, a flag, None, or a list of those."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, (int, float, str, bool, type(None)))


def is_cached(spec: ModelSpec) -> bool:
    """Whether a model loads without a download: its weights file is in the cache (as
    huggingface_hub lays it out), or its weights come from a package, timm or a folder."""
    if spec.source == "url":
        return pinned_path(spec).exists()
    if spec.source != "hf-hub":
        return True
    names = (spec.weights_file,) if spec.weights_file else WEIGHT_FILES
    return any(
        isinstance(
            try_to_load_from_cache(
                spec.repo, filename, cache_dir=cache_dir(), repo_type=spec.repo_type
            ),
            str,
        )
        for filename in names
    )


def pull(name: str, *, token: str | None = None) -> Checkpoint | None:
    """Download a registered model's config and weights into the cache (for offline compute
    nodes), with what its text tower reads: its repo's tokenizer, or the repos its
    open_clip_config.json names (BiomedCLIP's BERT); for ``timm:<arch>``, timm's pretrained
    weights of it; None for a model whose weights come from elsewhere (a package, a folder,
    random)."""
    spec = get_model(name)
    if spec.source == "timm":  # timm's own pretrained weights of the architecture
        repo = timm_weights_repo(spec.repo)
        if repo is None:
            raise ModelError(f"{name}: timm publishes no pretrained weights for it")
        if offline():
            raise ModelError(f"{name}: HF_HUB_OFFLINE is set; pull on a machine with internet")
        return fetch(name, repo, token=token)
    if spec.source == "url":  # one file at a URL, pinned by its sha256
        if offline():
            raise ModelError(f"{name}: HF_HUB_OFFLINE is set; pull on a machine with internet")
        return Checkpoint({}, fetch_pinned(spec), spec.repo, None)
    if spec.source != "hf-hub":
        return None
    repo = spec.repo
    if offline():
        raise ModelError(f"{name}: HF_HUB_OFFLINE is set; pull on a machine with internet")
    wanted = (spec.weights_file,) if spec.weights_file else WEIGHT_FILES
    down = _hub_down(repo, wanted[0], token, None, spec.repo_type)
    if down is not None:
        raise ModelError(_no_network(name, down)) from down
    try:
        with _quiet_retries():
            files = set(HfApi().list_repo_files(repo, token=token, repo_type=spec.repo_type))
    except (GatedRepoError, RepositoryNotFoundError, HfHubHTTPError) as exc:
        raise _explain(name, repo, exc) from exc
    except _unreachable() as exc:
        raise ModelError(_no_network(name, exc)) from exc
    if not files & set(wanted):
        raise ModelError(f"{name}: {repo} has none of {', '.join(wanted)}")
    checkpoint = fetch_spec(spec, token=token)
    if spec.text in TOKENIZER_IN_REPO:  # zero-shot reads its tokenizer from the same repo
        fetch_tokenizer(spec, token=token)
    if spec.text == "open_clip":  # a text tower that is a Hugging Face model: its repos
        from tilestore.embed.models.families import open_clip_config, open_clip_text_repos

        for text_repo in open_clip_text_repos(open_clip_config(spec, checkpoint.config)):
            fetch_text_model(name, text_repo, token=token)
    return checkpoint


def _unreachable() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises where the Hub cannot be reached: OSError, and its HTTP
    client's transport errors (httpx under huggingface_hub 1, httpx2 under 2), which are not
    OSErrors: a machine without network once got "internal error (ConnectError ...)"."""
    errors: list[type[BaseException]] = [OSError]
    for client in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(importlib.import_module(client).TransportError)
    return tuple(errors)


def _hub_down(
    repo: str, filename: str, token: str | None, revision: str | None, repo_type: str
) -> BaseException | None:
    """Why one HEAD request for a repo's file (PROBE_TIMEOUT, no retries) did not reach the
    Hub, or None where the Hub answered (any answer: the file's, or a refusal)."""
    url = hf_hub_url(repo, filename, repo_type=repo_type, revision=revision)
    try:
        get_hf_file_metadata(url, token=token, timeout=PROBE_TIMEOUT)
    except HfHubHTTPError:  # (an OSError: first) the Hub answered; the download says what
        return None
    except _unreachable() as exc:
        return exc
    return None


def _no_network(name: str, cause: BaseException) -> str:
    """One line for a Hub that cannot be reached: the host, the cause, what to do."""
    host = urlparse(constants.ENDPOINT).netloc or constants.ENDPOINT
    text = (str(cause).strip().splitlines() or [""])[0] or type(cause).__name__
    text = re.sub(r"^\[Errno -?\d+\] ", "", text)[:120]  # the OS's words, without its number
    return (
        f"{name}: no network to reach the Hugging Face Hub ({host}: {text}): run "
        f"`tilestore models pull {name}` where there is one, or set HF_HUB_OFFLINE=1 to use "
        "the local cache only"
    )


@contextlib.contextmanager
def _quiet_retries():
    """huggingface_hub logs each retry of an unreachable Hub as a warning line; the one line
    that says why the pull failed comes after them."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Missing(Exception):
    """A file the repo does not have (try the next candidate)."""


def _download(
    name,
    repo,
    filename,
    *,
    token,
    revision,
    cached_only=False,
    down=None,
    repo_type="model",
    optional=False,
) -> Path:
    """One file of a repo; `_Missing` where a weights file (or an `optional` file) is absent.
    down: why the Hub cannot be reached, where it cannot (so only the cache is asked)."""
    try:
        return Path(
            hf_hub_download(
                repo,
                filename,
                revision=revision,
                token=token,
                cache_dir=cache_dir(),
                repo_type=repo_type,
                local_files_only=cached_only or offline(),
            )
        )
    except LocalEntryNotFoundError as exc:  # (a subclass of EntryNotFoundError: first)
        lost = exc.__cause__  # the connection, lost after the Hub first answered
        if isinstance(lost, _unreachable()) and not isinstance(lost, HfHubHTTPError):
            raise ModelError(_no_network(name, lost)) from exc
        if optional or filename != "config.json":  # the caller tries the next one
            raise _Missing(filename) from exc
        raise ModelError(_not_cached(name, repo, down)) from exc
    except EntryNotFoundError as exc:
        raise _Missing(filename) from exc
    except (GatedRepoError, RepositoryNotFoundError, HfHubHTTPError) as exc:
        raise _explain(name, repo, exc) from exc
    except _unreachable() as exc:
        raise ModelError(f"{name}: cannot download {repo}/{filename}: {exc}") from exc


def _not_cached(name: str, repo: str, down: BaseException | None = None) -> str:
    """One line for a model the cache lacks where only the cache may be asked."""
    if down is not None:
        return _no_network(name, down)
    why = "HF_HUB_OFFLINE is set" if offline() else "cached_only=True"
    return (
        f"{name}: {repo} is not in the local cache {cache_dir()} ({why}): run "
        f"`tilestore models pull {name}` where there is a network, with the same HF_HOME"
    )


def _explain(name: str, repo: str, exc: Exception) -> ModelError:
    page = f"https://huggingface.co/{repo}"
    if isinstance(exc, GatedRepoError):
        return ModelError(
            f"{name}: {repo} is gated and this token has no access: accept the "
            f"terms at {page} (logged in), then pass hf_token=<token> or set HF_TOKEN"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(
            f"{name}: {repo} not found or private for this token; check {page} "
            "and the token (hf_token=<token> or HF_TOKEN)"
        )
    return ModelError(f"{name}: Hugging Face Hub error for {repo}: {exc}")


def _read_config(name: str, path: Path, kind: str | None = "timm") -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{name}: unreadable model config {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{name}: {path} is not a model config")
    if kind == "timm" and "architecture" not in config:
        raise ModelError(f"{name}: {path} is not a timm config (no 'architecture')")
    return config
