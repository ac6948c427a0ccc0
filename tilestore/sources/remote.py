"""Slides where they live: a slide file named by URL (s3://, gs://, https://, anything
fsspec names) is staged whole to the user's cache, then read as a local file.

Conversion reads every byte of a slide's pyramid, so the object is fetched once, in
`BLOCK` ranges with `IN_FLIGHT` requests at a time (fsspec's `cat_ranges`, concurrent on
its async filesystems), at the link's bandwidth rather than its round trip. A staged
file is written under a temporary name and renamed whole, with what it was staged from
beside it (the URL's identity, the object's size and ETag): a killed download leaves
nothing that reads as a slide, and a slide staged before is used again only while it is
that object, unchanged. The cache keeps at most `cache_limit` GB of slides, the least
recently used removed first, never one a process holds (`slide_file` holds it shared).

Credentials come from the provider's own chain (for S3: the environment, profiles,
instance roles; `AWS_ENDPOINT_URL` for another S3 server). A URL is shown without its
user, password or query in every message (`tilestore.urls`), and errors name the URL as
given, never the staged file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from zarr.storage import FsspecStore

from tilestore.caches import user_cache
from tilestore.errors import OptionError, ServerError, SlideError, StoreError, TilestoreError
from tilestore.options import Opt, checked
from tilestore.sources.dicomweb import DicomWebSeries
from tilestore.urls import is_dicomweb, is_url, local_path, redacted, shown

BLOCK = 32 * 2**20  # bytes a request asks for (a server that copies the object for each range,
# as moto's does, makes small ones dear: 91 MB staged in 1.86 s at 8 MB, 0.69 s at 32 MB)
IN_FLIGHT = 8  # requests at a time (after the first, alone: a server must honour ranges)
STAGED = ".staged.json"  # beside a staged slide: what it was staged from
PART_STALE_S = 86_400  # a temporary file left this long is a killed run's: removed

CacheLimit = Annotated[
    float,
    Opt(
        "Most slides staged from URLs kept in the cache (TILESTORE_CACHE/slides), least "
        "recently used removed first.",
        unit="GB",
        low=0,
        above=True,
        high=1e6,
    ),
]
CACHE_LIMIT = 50.0


def given(src: str | os.PathLike) -> str | Path:
    """A slide as given: a URL kept as text (a Path would fold its //), else a Path
    (file:// URLs too)."""
    return str(src) if is_url(src) else Path(local_path(str(src)))


@dataclass(frozen=True)
class Found:
    """What the object store says of a slide's object."""

    size: int
    tag: str  # its ETag (or what the server gives instead): changed when it changes; "": none
    modified: float | None = None  # its last change, in seconds since the epoch: the staged
    # file's own (a store records its source's time, the object's then, not the download's)


@dataclass(frozen=True)
class Remote:
    """A slide file at a URL, and where it is staged under the cache folder `cache`."""

    url: str
    cache: Path

    @property
    def local(self) -> Path:
        """cache/slides/<scheme>/<host>[_<port>]/<path>: the URL's own name, readable in a
        listing (the file keeps its name: a store records it). URLs alike but for their
        query or endpoint share it; their records tell them apart (`identity`)."""
        parts = urlsplit(self.url)
        steps = [s for s in parts.path.split("/") if s not in ("", ".", "..")]
        if not steps:
            raise SlideError(f"{shown(self.url)}: names no file (the URL has no path)")
        host = parts.netloc.rpartition("@")[2].replace(":", "_") or "_"
        return self.cache / "slides" / parts.scheme / host / Path(*steps)

    @property
    def identity(self) -> str:
        """What the staged file stands for, hashed (no secret written): the URL whole (its
        query too) and, for S3, the endpoint the environment names."""
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        seen = f"{self.url}\n{endpoint if self.url.startswith('s3://') else ''}"
        return hashlib.sha256(seen.encode()).hexdigest()

    def _fs(self):
        import fsspec

        try:
            return fsspec.core.url_to_fs(self.url, **storage_options(self.url))
        except (ImportError, ValueError) as exc:
            raise SlideError(
                f"{shown(self.url)}: cannot read {urlsplit(self.url).scheme}:// URLs: {_said(exc)}"
            ) from None

    def check(self) -> Found:
        """The object's size and tag (one request); SlideError in one line where it cannot
        be read: not there, access refused, no credentials, the server not answering."""
        fs, path = self._fs()
        try:
            fs.invalidate_cache(path)  # asked anew: a shared filesystem may have listed it
            info = fs.info(path)
        except Exception as exc:  # each store's own errors, said in one line
            raise _error(self.url, exc) from None
        if info.get("type") == "directory":
            raise SlideError(
                f"{shown(self.url)}: is a folder, not a slide file (a store in a bucket is "
                "read with open_slide, not converted)"
            )
        size = int(info.get("size") or 0)
        if size == 0:
            raise SlideError(f"{shown(self.url)}: the object is empty (0 bytes)")
        tags = ("ETag", "etag", "Content-MD5", "Digest", "LastModified", "Last-Modified")
        tag = next((str(info[k]).strip('"') for k in tags if info.get(k)), "")
        when = info.get("LastModified") or info.get("mtime")
        modified = when.timestamp() if hasattr(when, "timestamp") else None
        return Found(size, tag, modified)

    def staged(self, found: Found) -> bool:
        """Whether the slide is in the cache as the object is now: the same URL (and
        endpoint), size and tag; never where the server gives no tag."""
        try:
            said = json.loads(_meta(self.local).read_text())
        except (OSError, ValueError):
            return False
        same = (said.get("identity"), said.get("size"), said.get("tag")) == (
            self.identity,
            found.size,
            found.tag,
        )
        with contextlib.suppress(OSError):
            return bool(found.tag) and same and self.local.stat().st_size == found.size
        return False

    @checked
    def stage(
        self, limit_gb: CacheLimit = CACHE_LIMIT, progress: Callable[[int, int], None] | None = None
    ) -> Path:
        """The slide's local copy, fetched unless staged as the object is now. progress:
        called as progress(bytes_landed_now, bytes_total) as blocks land."""
        found = self.check()
        local = self.local
        if self.staged(found):
            with contextlib.suppress(OSError):  # used now: the last to be removed
                os.utime(_meta(local))
            if progress is not None:
                progress(found.size, found.size)
            return local
        _fits(self.url, found, limit_gb)
        limit = int(limit_gb * 1e9)
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SlideError(
                f"{local.parent}: cannot make the slide cache: {exc.strerror}"
            ) from None
        _make_room(self.cache / "slides", found.size, limit, keep=local)
        fd, name = tempfile.mkstemp(prefix=f".{local.name}.", suffix=".part", dir=local.parent)
        part = Path(name)
        try:
            with open(fd, "wb") as fh:
                self._fetch(fh, found, progress)
            if found.modified is not None:
                os.utime(part, (found.modified, found.modified))
            _meta(local).unlink(missing_ok=True)  # the old record goes before the old file
            os.replace(part, local)
            record = {"url": shown(self.url), "identity": self.identity, "size": found.size,
                      "tag": found.tag}  # fmt: skip
            _meta(local).write_text(json.dumps(record))
        except OSError as exc:
            raise SlideError(f"{shown(self.url)}: cannot stage to {local}: {exc}") from None
        finally:
            part.unlink(missing_ok=True)
        return local

    def _fetch(self, fh, found: Found, progress) -> None:
        fs, path = self._fs()
        starts = list(range(0, found.size, BLOCK))
        rounds = [starts[:1]] + [
            starts[i : i + IN_FLIGHT] for i in range(1, len(starts), IN_FLIGHT)
        ]
        done = 0
        for ask in rounds:
            if not ask:
                continue
            ends = [min(s + BLOCK, found.size) for s in ask]
            try:
                blocks = fs.cat_ranges([path] * len(ask), ask, ends, on_error="raise")
            except Exception as exc:  # each store's own errors, said in one line
                raise _error(self.url, exc, f" after {done / 1e6:.1f} MB") from None
            for start, end, data in zip(ask, ends, blocks, strict=True):
                if len(data) != end - start:  # the object shrank, a range ignored, a cut
                    raise SlideError(
                        f"{shown(self.url)}: bytes {start}-{end} came back {len(data)} long "
                        "(the object changed, the server ignores byte ranges, or the transfer "
                        "was cut); run again"
                    )
                os.pwrite(fh.fileno(), data, start)
                done += len(data)
            if progress is not None:
                progress(sum(e - s for s, e in zip(ask, ends, strict=True)), found.size)
        fh.flush()
        os.fsync(fh.fileno())
        if self.check() != found:
            raise SlideError(f"{shown(self.url)}: the object changed while it was read; run again")


NO_SIGN = "AWS_NO_SIGN_REQUEST"  # YES: a public bucket, its requests unsigned


class UrlStore(FsspecStore):
    """zarr's FsspecStore, named by its URL as `shown` (a dataset's `store`, a message); the
    one place a store read where it is meets the network. A request that fails (the
    server's refusal, a server that does not answer, a throttle past its retries) is one
    line naming the store and what it means (`failed_request`: a ServerError, whatever
    library raised it), never a library's exception for the caller to mistake for a bug;
    a server that answers a byte range with more than was asked (one that ignores Range)
    is said so, never taken for the range (a chunk's last 4 bytes would be the file's)."""

    def __str__(self) -> str:
        protocol = self.fs.protocol
        scheme = protocol[0] if isinstance(protocol, tuple | list) else protocol
        path = str(self.path)
        return shown(path if is_url(path) else f"{scheme}://{path}")

    __repr__ = __str__

    async def _asked(self, request, doing: str, passed: tuple[type[BaseException], ...] = ()):
        """`request` awaited; any library's failure of it a ServerError in one line naming
        the store and `doing` (`failed_request`), but ours and those in `passed`."""
        try:
            return await request
        except (TilestoreError, *passed):
            raise
        except Exception as exc:
            raise failed_request(str(self), exc, ServerError, doing) from None

    async def get(self, key, prototype, byte_range=None):
        found = await self._asked(super().get(key, prototype, byte_range), f"read {key}")
        asked = _asked_length(byte_range)
        if found is not None and asked is not None and len(found) > asked:
            raise ServerError(
                f"{self}: the server answered a byte range of {key} with {len(found)} bytes "
                f"where {asked} were asked (it ignores Range requests): a store is read "
                "there a chunk at a time; serve it from a server that takes ranges"
            )
        return found

    async def get_partial_values(self, prototype, key_ranges):
        request = super().get_partial_values(prototype, key_ranges)
        return await self._asked(request, "read the store")

    async def getsize(self, key: str) -> int:
        """The object's bytes; FileNotFoundError where there is none, as zarr's."""
        return await self._asked(super().getsize(key), f"read {key}", (FileNotFoundError,))

    async def exists(self, key: str) -> bool:
        return await self._asked(super().exists(key), f"read {key}")

    def list(self):
        return self._listed(super().list())

    def list_dir(self, prefix: str):
        return self._listed(super().list_dir(prefix))

    def list_prefix(self, prefix: str):
        return self._listed(super().list_prefix(prefix))

    async def _listed(self, keys):
        """A listing's keys as they come; its failed request said as `get`'s are."""
        try:
            async for key in keys:
                yield key
        except TilestoreError:
            raise
        except Exception as exc:
            raise failed_request(str(self), exc, ServerError, "list the store") from None


def _asked_length(byte_range) -> int | None:
    """How many bytes a byte range asks for at most (None: to the end, or none asked)."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest

    if isinstance(byte_range, RangeByteRequest):
        return byte_range.end - byte_range.start
    if isinstance(byte_range, SuffixByteRequest):
        return byte_range.suffix
    return None


def storage_options(url: str) -> dict[str, Any]:
    """fsspec's options for a URL: for S3, the endpoint and credentials the environment
    names, given as options so that fsspec's shared filesystem (a botocore client costs
    0.2-0.4 s to make) is one per endpoint and key, and a key changed in the environment
    gets a filesystem of its own; otherwise none (the provider's chain: profiles, roles).
    A public bucket is read unsigned only where asked: AWS_NO_SIGN_REQUEST=YES (GDAL's
    variable, the AWS CLI's --no-sign-request), whatever credentials the environment has."""
    if not url.startswith(("s3://", "s3a://")):
        return {}
    env, options = os.environ, {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    if env.get(NO_SIGN, "").strip().lower() in ("yes", "true", "1"):
        options["anon"] = True
    elif env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["key"], options["secret"] = env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["token"] = env["AWS_SESSION_TOKEN"]
    elif env.get("AWS_PROFILE"):
        options["profile"] = env["AWS_PROFILE"]
    return options


def url_store(url: str) -> UrlStore:
    """A store at a URL opened to read, as zarr's own `FsspecStore` (`storage_options`),
    named in messages and datasets by its URL as `shown`."""

    try:
        return UrlStore.from_url(url, read_only=True, storage_options=storage_options(url))
    except (ImportError, ValueError, TypeError) as exc:
        raise StoreError(
            f"{shown(url)}: cannot read {urlsplit(url).scheme}:// URLs: {_said(exc)}"
        ) from None


@checked
def stage_slide(
    url: str, limit_gb: CacheLimit = CACHE_LIMIT, progress: Callable[[int, int], None] | None = None
) -> Path:
    """A URL's slide staged to the user's cache (`Remote.stage`), its local file; a DICOMweb
    series' folder (`tilestore.sources.dicomweb`)."""
    if is_dicomweb(url):
        return DicomWebSeries(url, user_cache()).stage(progress)
    return Remote(url, user_cache()).stage(limit_gb, progress)


@contextlib.contextmanager
def slide_file(
    src: str | os.PathLike,
    limit_gb: float = CACHE_LIMIT,
    progress: Callable[[int, int], None] | None = None,
) -> Iterator[Path]:
    """The local file of a slide: `src` itself, or a URL's staged copy, held (a shared
    lock: the cache's eviction passes it by) while the block runs. Errors raised within
    that name the staged file name the URL instead."""
    if not is_url(src):
        yield Path(local_path(str(src)))
        return
    url = str(src)
    if is_dicomweb(url):  # a folder of the series' files, never evicted
        local = stage_slide(url, limit_gb, progress)
        with _named_by(url, local):
            yield local
        return
    for _ in range(3):  # staged, then removed by another process before it was held: again
        local = stage_slide(url, limit_gb, progress)
        try:
            fd = os.open(local, os.O_RDONLY)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.path.exists(local) and os.path.samestat(os.fstat(fd), os.stat(local)):
            break
        os.close(fd)
    else:
        raise SlideError(f"{shown(url)}: its staged copy was removed as it was staged (a full "
                         "slide cache shared by many runs?): raise --cache-limit")  # fmt: skip
    try:
        with _named_by(url, local):
            yield local
    finally:
        os.close(fd)


@contextlib.contextmanager
def _named_by(url: str, local: Path) -> Iterator[None]:
    """Errors raised within that name the staged file or folder name the URL instead."""
    try:
        yield
    except TilestoreError as exc:
        said = str(exc).replace(str(local), shown(url))
        if said != str(exc):
            exc.args = (said, *exc.args[1:])
        raise


def check_urls(
    sources: list, in_place: bool = False, *, look: bool = True, limit_gb: float = CACHE_LIMIT
) -> None:
    """The door's checks of the slides named by URL, before any work: OptionError for
    --in-place, which reads a slide where it is; with `look`, one request each, SlideError
    (one line) for one that cannot be read, OptionError for one larger than the cache holds
    (without: staging finds that out)."""
    for src in sources:
        if not is_url(src):
            continue
        if in_place:
            raise OptionError(
                f"--in-place: {shown(str(src))} is a URL; a slide is read in place only from a "
                "local disk (convert it instead)"
            )
        if look and is_dicomweb(src):
            DicomWebSeries(str(src), user_cache()).instances()
        elif look:
            _fits(str(src), Remote(str(src), user_cache()).check(), limit_gb)


def _fits(url: str, found: Found, limit_gb: float) -> None:
    """OptionError where the object is larger than the slide cache may hold."""
    if found.size > limit_gb * 1e9:
        raise OptionError(
            f"{shown(url)}: {found.size / 1e9:.2f} GB, more than the slide cache holds "
            f"(--cache-limit {limit_gb:g} GB)"
        )


def _meta(local: Path) -> Path:
    return local.with_name(local.name + STAGED)


def _make_room(folder: Path, need: int, limit: int, keep: Path) -> None:
    """Remove staged slides, least recently used first, until `need` more bytes fit within
    `limit`: never one a process holds (`slide_file`), nor `keep` (being replaced)."""
    for part in folder.rglob(".*.part"):  # a killed run's, a day old: no fetch takes that long
        with contextlib.suppress(OSError):
            if time.time() - part.stat().st_mtime > PART_STALE_S:
                part.unlink()
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
        if _removed_unless_held(slide, meta):
            used -= size


def _removed_unless_held(slide: Path, meta: Path) -> bool:
    """Remove a staged slide and its record unless a process holds it (a shared lock)."""
    try:
        fd = os.open(slide, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False  # in use
        raise
    try:
        meta.unlink(missing_ok=True)
        slide.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _said(exc: BaseException) -> str:
    """An error's own words in one line, every URL in it as `shown` (no secret)."""
    return redacted(" ".join(str(exc).split()) or type(exc).__name__)


_WHY = (  # an exception's class -> what it means, for the one line
    (FileNotFoundError, "not found (404): no such object or bucket"),
    (PermissionError, "access refused (403): check the credentials and the object's policy"),
)


# the errors of a server that does not answer (botocore's, aiohttp's), whatever the request
_GONE = frozenset(
    {
        "ClientConnectorError",
        "ClientOSError",
        "ConnectTimeoutError",
        "ConnectionClosedError",
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ServerDisconnectedError",
    }
)


def failed_request(
    url: str, exc: BaseException, kind: type[TilestoreError] = SlideError, doing: str = "read"
) -> TilestoreError:
    """One line for a failed request (a `kind` of error: a slide's, a store's): what the
    server said, and what it means; where it means nothing known, what could not be done
    (`doing`) and the server's own words."""
    name = type(exc).__name__
    why = next((why for kind_, why in _WHY if isinstance(exc, kind_)), None)
    if why is None and "Credentials" in name:
        why = (
            "no credentials found (set them as the provider's tools do, e.g. AWS_PROFILE; "
            f"a public bucket: {NO_SIGN}=YES)"
        )
    if why is None and ("SlowDown" in str(exc) or "reduce your request rate" in str(exc)):
        why = (
            "the server throttles (503 SlowDown) and still did after its retries "
            "(AWS_MAX_ATTEMPTS): run again later, or fewer at once"
        )
    if why is None and (isinstance(exc, ConnectionError | TimeoutError) or name in _GONE):
        why = (
            f"cannot {doing}: the server did not answer ({name}: stopped, or not reachable); "
            "run again once it answers"
        )
    if why is None:
        why = f"cannot {doing}: {name}: {_said(exc)}"
    return kind(f"{shown(url)}: {why}")


def _error(url: str, exc: BaseException, where: str = "") -> TilestoreError:
    """One line for a failed request to read a slide."""
    return failed_request(url, exc, SlideError, f"read{where}")


__all__ = [
    "CACHE_LIMIT",
    "CacheLimit",
    "Remote",
    "check_urls",
    "failed_request",
    "given",
    "is_url",
    "shown",
    "slide_file",
    "stage_slide",
    "url_store",
]
