"""URLs as tilestore takes and shows them: which inputs are URLs (s3://, gs://, https://;
file:// is a local path), and a URL shown without its secrets (user, password, query: a
signed URL's signature is its query), in a message or in any text an error brings along."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from tilestore.errors import OutputError, StoreError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# a URL inside a text (a library's error): scheme, then user info, then the rest up to a query
_IN_TEXT = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/\s@'\"<>]*@)?(?P<rest>[^\s?#'\"<>]*)"
    r"(?:[?#][^\s'\"<>]*)?"
)


def is_url(text: str | os.PathLike) -> bool:
    """Whether an input is named by URL (text only: a Path has folded its // already)."""
    return isinstance(text, str) and bool(_URL.match(text)) and not text.startswith("file://")


DICOMWEB = "dicomweb+"  # in front of a DICOMweb service's URL: a series there, not a file


def is_dicomweb(text: str | os.PathLike) -> bool:
    """Whether an input names a series on a DICOMweb server (`tilestore.sources.dicomweb`)."""
    return isinstance(text, str) and text.startswith(DICOMWEB)


def local_path(text: str) -> str:
    """A file:// URL's path; any other text as it is."""
    return urlsplit(text).path if text.startswith("file://") else text


def written_here(path: str | os.PathLike, option: str) -> Path:
    """A path tilestore writes (a store, a folder, a file), as a Path (a file:// URL: its
    path); OutputError naming `option` where it is another URL. Taken as a local path,
    s3://bucket/x would be written to a folder named "s3:" here, exit 0 (a `Path` folds its
    //): it is refused instead, before any work. Stores and files are written to a local or
    mounted file system; object storage is read (slides, stores), not written yet."""
    if is_url(path):
        raise OutputError(
            f"{option} {shown(str(path))}: a URL; tilestore writes to a local or mounted file "
            "system, not to object storage: write it here, then copy it there (aws s3 sync, "
            "gcloud storage rsync)"
        )
    return Path(local_path(path) if isinstance(path, str) else path)


# object stores a store is written to (built here, then uploaded: `tilestore.conversion.bucket`)
STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")


def store_written(path: str | os.PathLike, option: str) -> Path | str:
    """Where a store is written (`option`): a local path (`written_here`), or the URL of a
    place in object storage (`STORE_SCHEMES`: built here, then uploaded,
    `tilestore.conversion.bucket`). Any other URL is refused in one line: an http(s) or
    DICOMweb server's is read by tilestore, never written; another scheme's is not an
    object store tilestore writes."""
    if not is_url(path):
        return written_here(path, option)
    scheme = urlsplit(str(path)).scheme
    if scheme in ("http", "https") or is_dicomweb(path):
        raise OutputError(
            f"{option} {shown(str(path))}: {scheme}:// URLs are read, never written: give a "
            "bucket's (s3://, gs://) or a local folder"
        )
    if scheme not in STORE_SCHEMES:
        raise OutputError(
            f"{option} {shown(str(path))}: {scheme}:// is not an object store tilestore "
            f"writes stores to ({', '.join(f'{s}://' for s in STORE_SCHEMES)}), nor a local path"
        )
    return str(path)


def store_read(path: str | os.PathLike) -> Path | str:
    """A store a command reads, as tilestore opens it: a local path (a Path; a file:// URL's
    path), or a URL kept as its text (a store in a bucket or on a web server, read where it
    is: `tilestore.sources.remote.url_store`). Taken as a Path, s3://bucket/x.ome.zarr
    would be "s3:/bucket/x.ome.zarr", and said to be no store."""
    if is_url(path):
        return str(path)
    return Path(local_path(path) if isinstance(path, str) else path)


def store_changed(path: str | os.PathLike, command: str) -> Path:
    """A store `command` writes into (its masks, plans, QC, shards), as a Path; a URL
    refused in one line (StoreError), before any work: a store in object storage is read
    where it is (`status`, `info`, `open_embeddings`, `export`, `view`), and written only
    whole, by `tilestore convert -o s3://...`."""
    if is_url(path):
        raise only_read(shown(str(path)), f"what {command} writes")
    return Path(local_path(path) if isinstance(path, str) else path)


def only_read(where: str, what: str) -> StoreError:
    """The one line for `what` asked to go into a store in object storage (`where`, as
    shown): such a store is read where it is, written only whole (`convert -o s3://...`)."""
    return StoreError(
        f"{where}: {what} goes into the store, and a store in object storage is only read "
        "where it is: copy it here (aws s3 sync, gcloud storage rsync), write into the copy, "
        "then copy it back"
    )


def shown(url: str) -> str:
    """The URL as messages show it: scheme, host (and port), path; no user, password, query
    or fragment."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def named(src: str | os.PathLike) -> str:
    """An input as messages and reports name it: a path as it is, a URL as `shown`."""
    return shown(str(src)) if is_url(src) else str(src)


def redacted(text: str) -> str:
    """`text` with every URL in it as `shown`: a library's error quoting the URL it asked
    for (with its signature, as it rewrote it) says no secret."""
    return _IN_TEXT.sub(lambda m: m.group("scheme") + m.group("rest"), text)
