"""Weights published as one file at a URL, not on a hub (DinoBloom's, on Zenodo): pinned in
the catalogue by the sha256 of their bytes (`ModelSpec.sha256`), fetched once into
tilestore's cache and checked.

A download is written beside its place, hashed as it streams, and renamed into place only
when its sha256 is the pinned one: a cut download, or a file the server changed, is never
used (one line says which). A file in the cache is hashed again at each load, as a folder's
weights are (`tilestore.embed.models.hub.weights_sha256`): a copy changed since (one byte) is
refused in one line naming it. Offline (HF_HUB_OFFLINE, which every model source honours), a
file not in the cache is one line saying where to put it and how to fetch it elsewhere.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from tilestore.caches import user_cache
from tilestore.embed.models.spec import ModelSpec
from tilestore.errors import ModelError

TIMEOUT_S = 60  # a request's connect and read timeout
CHUNK = 1 << 20  # bytes read and hashed at a time


def pinned_path(spec: ModelSpec) -> Path:
    """Where a pinned file lives in the cache: named by the model and the file's name."""
    return user_cache() / "weights" / spec.name / (spec.weights_file or _file_name(spec.repo))


def fetch_pinned(spec: ModelSpec, *, offline: bool = False) -> Path:
    """The model's pinned file: from the cache, checked, or (not `offline`) downloaded into
    it first; ModelError in one line where it is not there, not the pinned bytes, or cannot
    be fetched."""
    path = pinned_path(spec)
    if not path.exists():
        if offline:
            raise ModelError(
                f"{spec.name}: its weights are not in the cache ({path}); run `tilestore "
                f"models pull {spec.name}` where {spec.repo} can be reached, or put "
                f"{_file_name(spec.repo)} there (sha256 {spec.sha256})"
            )
        _download(spec, path)
    found = _sha256(path)
    if found != spec.sha256:
        raise ModelError(
            f"{spec.name}: {path} is not the file pinned (sha256 {found}, pinned "
            f"{spec.sha256}): changed since it was fetched; remove it and pull again"
        )
    return path


def _sha256(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except OSError as exc:
        raise ModelError(f"cannot read weights {path} ({exc.strerror or exc})") from exc


def _download(spec: ModelSpec, path: Path) -> None:
    """Fetch the file beside its place, hashing it as it streams; renamed into place only
    where it is the pinned bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # of this process on this host (a cache shared by several nodes, over NFS)
    part = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.part")
    digest, size, told = hashlib.sha256(), 0, None
    try:
        with (
            urllib.request.urlopen(spec.repo, timeout=TIMEOUT_S) as answer,
            open(part, "wb") as out,
        ):
            told = answer.headers.get("Content-Length")
            while block := answer.read(CHUNK):
                digest.update(block)
                out.write(block)
                size += len(block)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        part.unlink(missing_ok=True)
        why = getattr(exc, "reason", None) or exc or type(exc).__name__
        raise ModelError(f"{spec.name}: cannot fetch {spec.repo} ({why})") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    if told is not None and told.isdigit() and int(told) != size:
        part.unlink(missing_ok=True)
        raise ModelError(
            f"{spec.name}: {spec.repo} ended after {size:,} of its {int(told):,} bytes; "
            "nothing kept: try again"
        )
    if digest.hexdigest() != spec.sha256:
        part.unlink(missing_ok=True)
        raise ModelError(
            f"{spec.name}: {spec.repo} gave a file whose sha256 is {digest.hexdigest()}, not "
            f"the pinned {spec.sha256}: not used"
        )
    shutil.move(part, path)


def _file_name(url: str) -> str:
    return Path(urlsplit(url).path).name
