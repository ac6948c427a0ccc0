"""Slides where they live: a slide file named by URL (s3://, gs://, https://, anything
fsspec names) is staged whole to the user's cache, then read as a local file.

Conversion reads every byte of a slide's pyramid, so the object is fetched once, in
`BLOCK` ranges with `IN_FLIGHT` requests at a time (fsspec's `cat_ranges`, concurrent on
its async filesystems), at the link's bandwidth rather than its round trip. A staged
file is written under a temporary name and renamed whole, with what it was staged from
(size, ETag) beside it: a killed download leaves nothing that reads as a slide, and a
slide staged before is used again while its object is unchanged. The cache keeps at most
`cache_limit` GB of slides, the least recently used removed first.

Credentials come from the provider's own chain (for S3: the environment, profiles,
instance roles; `AWS_ENDPOINT_URL` for another S3 server). A URL is shown without its
user, password or query (a signed URL's signature is its query) in every message, and
errors name the URL as given, never the staged file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from tilestore.caches import user_cache
from tilestore.errors import OptionError, SlideError, TilestoreError
from tilestore.options import Opt

BLOCK = 8 * 2**20  # bytes a request asks for
IN_FLIGHT = 8  # requests at a time
STAGED = ".staged.json"  # beside a staged slide: what it was staged from
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

CacheLimit = Annotated[
    float,
    Opt(
        "Most slides staged from URLs kept in the cache (TILESTORE_CACHE/slides), least "
        "recently used removed first.",
        unit="GB",
        low=0,
    ),
]
CACHE_LIMIT = 50.0


def is_url(text: str | os.PathLike) -> bool:
    """Whether a slide is named by URL (file:// aside: that is a local path)."""
    return isinstance(text, str) and bool(_URL.match(text)) and not text.startswith("file://")


def given(src: str | os.PathLike) -> str | Path:
    """A slide as given: a URL kept as text (a Path would fold its //), else a Path."""
    return str(src) if is_url(src) else Path(src)


def shown(url: str) -> str:
    """The URL as messages show it: no user, password or query (a signed URL's secret)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


@dataclass(frozen=True)
class Found:
    """What the object store says of a slide's object."""

    size: int
    tag: str  # its ETag (or what the filesystem gives instead): changed when it changes
    modified: float | None = None  # its last change, in seconds since the epoch: the staged
    # file's own (a store records its source's time, the object's then, not the download's)


@dataclass(frozen=True)
class Remote:
    """A slide file at a URL, and where it is staged under the cache folder `cache`."""

    url: str
    cache: Path

    @property
    def local(self) -> Path:
        """cache/slides/<scheme>/<host>/<path>: the URL's own name, readable in a listing."""
        parts = urlsplit(self.url)
        steps = [s for s in parts.path.split("/") if s not in ("", ".", "..")]
        if not steps:
            raise SlideError(f"{shown(self.url)}: names no file (the URL has no path)")
        return self.cache / "slides" / parts.scheme / (parts.hostname or "_") / Path(*steps)

    def _fs(self):
        import fsspec

        try:
            # a filesystem of its own: fsspec's shared ones keep the credentials and the
            # listings they first saw (a changed object, a key rotated in a long session)
            return fsspec.core.url_to_fs(self.url, skip_instance_cache=True)
        except (ImportError, ValueError) as exc:
            raise SlideError(
                f"{shown(self.url)}: cannot read {urlsplit(self.url).scheme}:// URLs: "
                f"{_said(exc, self.url)}"
            ) from exc

    def check(self) -> Found:
        """The object's size and tag (one request); SlideError in one line where it cannot
        be read: not there, access refused, no credentials, the server not answering."""
        fs, path = self._fs()
        try:
            info = fs.info(path)
        except Exception as exc:  # each store's own errors, said in one line
            raise _error(self.url, exc) from None
        if info.get("type") == "directory":
            raise SlideError(f"{shown(self.url)}: is a folder, not a slide file")
        size = int(info.get("size") or 0)
        if size == 0:
            raise SlideError(f"{shown(self.url)}: the object is empty (0 bytes)")
        tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or ""
        when = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
        modified = when.timestamp() if hasattr(when, "timestamp") else None
        return Found(size, str(tag).strip('"'), modified)

    def staged(self, found: Found) -> bool:
        """Whether the slide is in the cache as the object is now."""
        try:
            said = json.loads(_meta(self.local).read_text())
        except (OSError, ValueError):
            return False
        same = said.get("size") == found.size and said.get("tag") == found.tag
        return same and self.local.is_file() and self.local.stat().st_size == found.size

    def stage(
        self, limit_gb: float = CACHE_LIMIT, progress: Callable[[int, int], None] | None = None
    ) -> Path:
        """The slide's local copy, fetched unless staged as the object is now. progress:
        called as progress(bytes_landed_now, bytes_total) as blocks land."""
        found = self.check()
        local = self.local
        if self.staged(found):
            os.utime(_meta(local))  # used now: the last to be removed
            if progress is not None:
                progress(found.size, found.size)
            return local
        limit = int(limit_gb * 1e9)
        if found.size > limit:
            raise OptionError(
                f"{shown(self.url)}: {found.size / 1e9:.2f} GB, more than the slide cache holds "
                f"(--cache-limit {limit_gb:g} GB)"
            )
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SlideError(
                f"{local.parent}: cannot make the slide cache: {exc.strerror}"
            ) from None
        _make_room(self.cache / "slides", found.size, limit, keep=local)
        part = local.with_name(f".{local.name}.{os.getpid()}.part")
        try:
            self._fetch(part, found, progress)
            _meta(local).unlink(missing_ok=True)  # the old record goes before the old file
            if found.modified is not None:
                os.utime(part, (found.modified, found.modified))
            os.replace(part, local)
            _meta(local).write_text(
                json.dumps({"url": shown(self.url), "size": found.size, "tag": found.tag})
            )
        except OSError as exc:
            raise SlideError(f"{shown(self.url)}: cannot stage to {local}: {exc}") from exc
        finally:
            part.unlink(missing_ok=True)
        return local

    def _fetch(self, part: Path, found: Found, progress) -> None:
        fs, path = self._fs()
        starts = list(range(0, found.size, BLOCK))
        done = 0
        with open(part, "wb") as fh:
            for first in range(0, len(starts), IN_FLIGHT):
                landed = done
                ask = starts[first : first + IN_FLIGHT]
                ends = [min(s + BLOCK, found.size) for s in ask]
                try:
                    blocks = fs.cat_ranges([path] * len(ask), ask, ends, on_error="raise")
                except Exception as exc:
                    raise _error(self.url, exc, f" after {done / 1e6:.1f} MB") from None
                for start, end, data in zip(ask, ends, blocks, strict=True):
                    if len(data) != end - start:  # the object shrank, or the link cut it
                        raise SlideError(
                            f"{shown(self.url)}: bytes {start}-{end} came back {len(data)} "
                            f"long: the object changed or the transfer was cut; run again"
                        )
                    os.pwrite(fh.fileno(), data, start)
                    done += len(data)
                if progress is not None:
                    progress(done - landed, found.size)
            fh.flush()
            os.fsync(fh.fileno())
        if self.check() != found:
            raise SlideError(f"{shown(self.url)}: the object changed while it was read; run again")


def stage_slide(
    url: str, limit_gb: float = CACHE_LIMIT, progress: Callable[[int, int], None] | None = None
) -> Path:
    """A URL's slide staged to the user's cache (`Remote.stage`), its local file."""
    return Remote(url, user_cache()).stage(limit_gb, progress)


@contextlib.contextmanager
def slide_file(
    src: str | os.PathLike,
    limit_gb: float = CACHE_LIMIT,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[Path]:
    """The local file of a slide: `src` itself, or a URL's staged copy. Errors raised
    within that name the staged file name the URL instead."""
    if not is_url(src):
        yield Path(src)
        return
    url = str(src)
    local = stage_slide(url, limit_gb, progress)
    try:
        yield local
    except TilestoreError as exc:
        said = str(exc).replace(str(local), shown(url))
        if said == str(exc):
            raise
        raise type(exc)(said) from exc


def check_urls(sources: list, in_place: bool = False, *, look: bool = True) -> None:
    """The door's checks of the slides named by URL, before any work: OptionError for
    --in-place, which reads a slide where it is; with `look`, one request each, SlideError
    (one line) for one that cannot be read (without: staging finds that out)."""
    for src in sources:
        if not is_url(src):
            continue
        if in_place:
            raise OptionError(
                f"--in-place: {shown(str(src))} is a URL; a slide is read in place only from a "
                "local disk (convert it instead)"
            )
        if look:
            Remote(str(src), user_cache()).check()


def _meta(local: Path) -> Path:
    return local.with_name(local.name + STAGED)


def _make_room(folder: Path, need: int, limit: int, keep: Path) -> None:
    """Remove staged slides, least recently used first, until `need` more bytes fit
    within `limit` (`keep` aside: it is being replaced)."""
    staged = []
    for meta in folder.rglob(f"*{STAGED}"):
        slide = meta.with_name(meta.name[: -len(STAGED)])
        with contextlib.suppress(OSError):
            if slide != keep:
                staged.append((meta.stat().st_mtime, slide.stat().st_size, slide, meta))
    used = sum(size for _, size, _, _ in staged)
    for _, size, slide, meta in sorted(staged, key=lambda s: s[0]):
        if used + need <= limit:
            break
        with contextlib.suppress(OSError):
            meta.unlink()
            slide.unlink()
            used -= size


def _said(exc: BaseException, url: str) -> str:
    """An error's own words in one line, with the URL as `shown` (no secret)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    parts = urlsplit(url)
    for secret in (url, parts.query, parts.password, parts.username):
        if secret:
            text = text.replace(secret, shown(url) if secret == url else "***")
    return text


_WHY = (  # an exception's class -> what it means, for the one line
    (FileNotFoundError, "not found (404): no such object or bucket"),
    (PermissionError, "access refused (403): check the credentials and the object's policy"),
)


def _error(url: str, exc: BaseException, where: str = "") -> SlideError:
    """One line for a failed request: what the store said, and what it means."""
    name = type(exc).__name__
    why = next((why for kind, why in _WHY if isinstance(exc, kind)), None)
    if why is None and "Credentials" in name:
        why = "no credentials found (set them as the provider's tools do, e.g. AWS_PROFILE)"
    if why is None:
        why = f"cannot read{where}: {name}: {_said(exc, url)}"
    return SlideError(f"{shown(url)}: {why}")


__all__ = [
    "CACHE_LIMIT",
    "CacheLimit",
    "Remote",
    "check_urls",
    "given",
    "is_url",
    "shown",
    "slide_file",
    "stage_slide",
]
