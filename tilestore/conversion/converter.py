"""Convert a slide, once, into an OME-Zarr 0.5 store.

The store is built under a hidden temporary name beside the target and renamed
into place only when every chunk and the ``complete`` flag are written, so an
interrupted or failed conversion never leaves something that looks valid, and
``overwrite`` never loses the old store before the new one is whole.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal, get_args
from urllib.parse import urlsplit

import numpy as np
import zarr
from zarr.codecs import BytesCodec
from zarr.storage import LocalStore

from tilestore import locks
from tilestore.conversion.bucket import built_for, no_sidecars_there, store_url
from tilestore.conversion.levels import copy_tiles, downsample2, write_blocks
from tilestore.conversion.loss import Loss
from tilestore.cpus import usable_cpus
from tilestore.errors import (
    ChunkError,
    OptionError,
    SlideError,
    StoreError,
    TilestoreError,
    TilestoreWarning,
)
from tilestore.format import leftovers, omezarr, positions
from tilestore.format.chunks import ChunkReader
from tilestore.format.codecs import jpeg_codecs, zstd_codecs
from tilestore.format.record import Integrity, LevelRecord, Mpp, SourceRecord, StoreRecord
from tilestore.format.shards import SHARD_CHUNKS, shard_shape, sharded
from tilestore.format.store import (
    STORE_FORMAT,
    STORE_SUFFIX,
    is_store,
    open_group,
    software_versions,
    store_name,
    tree_size,
    write_record,
)
from tilestore.masks.options import TissueBesideMethod
from tilestore.options import Opt, Workers, checked
from tilestore.reading.inplace import (
    TILE_SUMS_SAID,
    TiffTiles,
    fingerprint,
    record_tile_sums,
    tile_sums,
)
from tilestore.reading.resolution import OverrideMpp, ScanMpp, check_made, settle_mpp
from tilestore.reading.slide import Slide
from tilestore.reading.source_chunks import chunk_source
from tilestore.sources import Fact, Source, SourceLevel, dicom_series, open_source
from tilestore.sources.remote import (
    CACHE_LIMIT,
    CacheLimit,
    check_urls,
    is_url,
    slide_file,
)
from tilestore.urls import is_dicomweb, named, store_written

Codec = Literal["auto", "jpeg", "zstd"]
CODECS = get_args(Codec)
Subsampling = Literal["4:4:4", "4:2:2", "4:4:0", "4:2:0", "4:1:1"]  # codecs.SAMPLING_NAMES
SMALLEST_LEVEL = 1024  # build 2x levels until the longer side is at most this
# JPEG settings where pixels are (re-)encoded: above 40 dB PSNR on real H&E and IHC
QUALITY = 95
SUBSAMPLING = "4:4:4"


@dataclass
class LevelReport:
    """How one store level was made."""

    path: str
    shape: tuple[int, ...]
    downsample: tuple[float, float]
    origin: str  # "source level 0" or "built from level 1"
    write: str  # "copy", "re-encode", "lossless" or "in place"
    reason: str
    chunks: int = 0
    reencoded: int = 0  # copy path: tiles that had to be re-encoded
    # JPEG encoded here from pixels (a level re-encoded or built, a copy's odd tiles), not
    # copied as the slide has it: what it lost, as the PSNR (dB) of `sampled` chunks read
    # back against the pixels they were encoded from (`tilestore.conversion.loss`); None
    # where none was measured (a copy's odd tiles) or the sample came back exact
    lossy: bool = False
    psnr: float | None = None
    sampled: int = 0
    seconds: float = 0.0

    def loss(self) -> str:
        """What this level lost, in words: 'level 1 PSNR 44.2 dB (35 chunks sampled)'."""
        if self.psnr is not None:
            return f"level {self.path} PSNR {self.psnr:.1f} dB ({self.sampled} chunks sampled)"
        if self.sampled:
            return f"level {self.path} exact on its {self.sampled} chunks sampled"
        return f"level {self.path}: {self.reencoded} tiles re-encoded (not measured)"


@dataclass
class ConversionReport:
    """What `convert` did, for printing and for tests."""

    source: Path
    store: Path | str  # a bucket's: its URL
    codec: str
    codec_reason: str
    chunk: int
    quality: int | None = None  # JPEG's, where pixels are encoded
    levels: list[LevelReport] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    source_bytes: int = 0
    store_bytes: int = 0
    # the tissue mask made beside the levels (tissue=...): how, and in how many seconds
    tissue: str | None = None

    @property
    def lossy(self) -> bool:
        """Whether any level holds JPEG encoded here (not copied as the slide had it)."""
        return any(level.lossy for level in self.levels)

    def summary(self) -> str:
        """The codec, why, and what it lost, in one line: 'codec jpeg q95 (asked for): LOSSY,
        level 0 PSNR 40.5 dB (64 chunks sampled)'; the finest lossy level is named (each
        level's is in `levels`)."""
        kept = {"copy": "copied", "in place": "read in place", "lossless": "lossless"}
        lossy = [level for level in self.levels if level.lossy]
        codec = f"codec {self.codec}" + (f" q{self.quality}" if lossy and self.quality else "")
        if not lossy:
            said = sorted({kept.get(level.write, level.write) for level in self.levels})
            return f"{codec} ({self.codec_reason}): {', '.join(said)}"
        first = self.levels[0]
        as_is = "" if first.lossy else f"level 0 {kept.get(first.write, first.write)}; "
        return f"{codec} ({self.codec_reason}): {as_is}LOSSY, {lossy[0].loss()}"


@dataclass(frozen=True)
class _Encoding:
    """How pixels are written, decided once per conversion."""

    codec: str
    reason: str
    chunk: int
    quality: int
    subsampling: str
    copy: bool
    background: int  # fill for missing chunks and out-of-slide reads: white for brightfield
    workers: int
    checksums: bool  # each chunk ends in its CRC-32C (tilestore.format.integrity)
    shard: int  # chunks per shard side; 0: one file per chunk
    in_place: frozenset[int] = frozenset()  # source levels read from the slide, not copied
    decoded: frozenset[int] = frozenset()  # of those, the ones decoded at each read (no JPEG)


@checked
def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    chunk: Annotated[
        int | None,
        Opt(
            "Chunk side.",
            unit="px",
            low=64,
            high=4096,
            multiple=16,
            none="the source's JPEG tile where tiles are copied, else 256",
        ),
    ] = None,
    codec: Annotated[
        Codec,
        Opt("auto (JPEG for 8-bit RGB brightfield stored lossy, else zstd), jpeg or zstd."),
    ] = "auto",
    quality: Annotated[
        int, Opt("JPEG quality where pixels are (re-)encoded.", low=1, high=100)
    ] = QUALITY,
    subsampling: Annotated[
        Subsampling, Opt("JPEG chroma subsampling where pixels are (re-)encoded.")
    ] = SUBSAMPLING,
    mpp: ScanMpp = None,
    override_mpp: OverrideMpp = False,
    keep_associated: Annotated[
        bool, Opt("Also store label/macro images (labels carry patient data).")
    ] = False,
    overwrite: Annotated[
        bool,
        Opt(
            "Replace an existing store (a local one once the new one is complete; one in a "
            "bucket object by object, once the new one is built)."
        ),
    ] = False,
    copy: Annotated[
        bool, Opt("Copy matching JPEG tiles verbatim (no: decode and encode them).")
    ] = True,
    workers: Workers = None,
    checksums: Annotated[
        bool, Opt("End every chunk with its CRC-32C so damage is found when read.")
    ] = True,
    lossy_ok: Annotated[
        bool, Opt("Allow codec jpeg on pixels that are not 8-bit RGB brightfield.")
    ] = False,
    series: str | None = None,
    name: Annotated[
        str | None,
        Opt("Store name (<name>.ome.zarr) for a single slide.", none="the file's"),
    ] = None,
    progress: Callable[[int, int], None] | None = None,
    in_place: Annotated[
        bool,
        Opt(
            "Read TIFF slides where they are instead: make each a sidecar store "
            "(<slide>.tilestore.zarr) holding only metadata and coarse levels.",
            flag="in_place",
        ),
    ] = False,
    shard: Annotated[
        int | Literal["off"],
        Opt(
            "Chunks per shard side: a slide is a few files, not one per chunk ('off': a "
            "file per chunk, the layout before shards).",
            low=1,
            high=256,
            metavar="N|off",
        ),
    ] = SHARD_CHUNKS,
    tissue: TissueBesideMethod = None,
    cache_limit: CacheLimit = CACHE_LIMIT,
) -> ConversionReport:
    """Convert the slide `src` into ``<dst>/<name>.ome.zarr`` (or `dst` itself if it ends in .zarr).

    Each option is declared above (type, range, default; `tilestore.options`) and checked at
    the call. chunk: None takes the source's JPEG tile size when tiles can be copied, else
    256. codec "auto": JPEG for 8-bit RGB brightfield the slide stores lossy, its JPEG
    tiles copied; zstd otherwise: a lossless source stays lossless (`choose_codec`). Each
    level JPEG is encoded into says what it lost (PSNR on a sample of its chunks) in the
    report and the store's attributes. quality/subsampling: 95 and 4:4:4 keep real H&E and
    IHC above 40 dB PSNR. lossy_ok: without it codec="jpeg" on fluorescence or one page per
    marker is refused, since JPEG quantises quantitative signal. checksums: off only to
    measure what they cost, or for readers without zarr's crc32c codec.
    mpp: the level-0 um/px where the file states none; where it states one, a size that
        disagrees (beyond `MPP_TOLERANCE`) is refused in one line unless override_mpp, which
        records the size given as an override, with the file's own
        (`tilestore.reading.resolution.settle_mpp`); one that agrees is recorded as the file's.
    series: the DICOM SeriesInstanceUID to convert where `src` is a folder holding several
        (`tilestore.sources.dicom_series` lists them); its store is named <folder>-<uid>.
    progress: called as progress(chunks_done_now, chunks_total), from worker threads.
    in_place: make a sidecar store at `dst` (`tilestore.conversion.sidecar`): the source levels stay
        in the slide file and are read from it (JPEG tiles as chunks where they can be, else
        decoded at each read); only the metadata and the built levels are written.
    shard: chunks per shard side (`tilestore.format.shards`): a slide is a few hundred files,
        not one per chunk; "off" writes one file per chunk, as stores before shards were.
    tissue: also make the store's tissue mask with this method (`compute_tissue`), stored as
        labels/tissue before the store appears: computed beside the conversion (on a
        thread, or for a large mask beside a copy in a process: `conversion.beside`) from
        the level it reads as soon as that is written (the coarse levels are written
        first), so a slide's mask costs no time after its level 0 is copied. The same mask
        `compute_tissue` gives on the finished store, bit for bit. One it cannot make (no
        level near its resolution) is left out, for the plan to make and refuse as before.
    src may be a URL (s3://, gs://, https://...): the slide is staged whole to the user's
        cache first (`tilestore.sources.remote`), which keeps at most cache_limit GB; the
        store is the one its local file would make.
    """
    started = time.perf_counter()
    dst = store_written(dst, "dst")
    if in_place:
        no_sidecars_there(dst, "dst")
    check_urls([src], in_place, look=False)  # staging looks
    place = converted_store(src, dst, series, name)
    # in a bucket (`tilestore.conversion.bucket`): the place checked and marked now, before
    # the slide is staged; the store built in the cache, then uploaded
    with (
        built_for(place, overwrite) as target,
        slide_file(src, cache_limit) as local,
        open_source(local, series) as source,
    ):
        mpp_fact, mpp_warnings = _resolve_mpp(source, mpp, override_mpp)
        _check_target(target, overwrite)
        codec_name, reason = choose_codec(source, codec, lossy_ok)
        encoding = _Encoding(
            codec_name,
            reason,
            _choose_chunk(source, chunk, copy and codec_name == "jpeg"),
            quality,
            subsampling,
            copy,
            255 if source.brightfield_rgb else 0,
            workers or usable_cpus(),
            checksums,
            0 if shard == "off" else shard,
        )
        if in_place:
            jpeg_levels = _jpeg_levels(source, encoding)
            everything = frozenset(range(len(source.levels)))
            encoding = replace(encoding, in_place=everything, decoded=everything - jpeg_levels)
        report = ConversionReport(
            local,
            target,
            codec_name,
            reason,
            encoding.chunk,
            quality if codec_name == "jpeg" else None,
            warnings=mpp_warnings,
        )
        with (
            ThreadPoolExecutor(1) as hasher,
            leftovers.built_beside(target, "cannot write store", replace=overwrite) as tmp,
        ):
            digest = hasher.submit(source.sha256)
            # in place: each tile's CRC-32C, read after the hash (the file is in the cache)
            sums = hasher.submit(tile_sums, source, encoding.in_place) if in_place else None
            sources: dict = {}  # in place: level path -> its tiles, once the arrays exist
            store = TiffTiles(LocalStore(tmp), sources) if in_place else tmp
            root = zarr.open_group(store, mode="w-", zarr_format=3)
            plan = _level_plan(source)
            arrays = _create_arrays(root, source, plan, encoding)
            for index in encoding.in_place:
                sources[str(index)] = chunk_source(
                    source, index, arrays[index], encoding.background, encoding.decoded
                )
            beside = None
            if tissue is not None:  # its levels as the store will record them, as written
                from tilestore.conversion.beside import TissueBeside

                early = _record(source, encoding, mpp_fact, _plan_levels(plan), {}, None)
                folder = None if in_place else tmp  # a copy's levels: another process reads
                order = write_order(len(source.levels), len(plan))
                beside = TissueBeside(tissue, Slide(root, early, named(place)), folder, order)
            try:
                written = beside.written if beside else None
                _write_levels(source, arrays, plan, tmp, encoding, report, progress, written)
                associated = _write_associated(source, root) if keep_associated else []
                if sums is not None:
                    record_tile_sums(root, sums.result())
                _write_attrs(
                    root, source, plan, encoding, report, mpp_fact, associated, digest.result()
                )
                if beside is not None:
                    report.tissue = beside.store(Slide(*open_group(store), named(place)))
            finally:
                if beside is not None:
                    beside.close()
            report.store_bytes = tree_size(tmp)
            if overwrite:  # a run may have begun on the old store meanwhile: it stays
                locks.refuse_while_written(target, "replacing it (overwrite=True)")
        report.store = place  # a bucket's: its URL
        report.source_bytes = source.size()  # while the file is held (a staged copy's too)
    for message in report.warnings:
        warnings.warn(f"{named(src)}: {message}", TilestoreWarning, stacklevel=2)
    report.seconds = time.perf_counter() - started
    return report


def check_mpp(slide, mpp: float | None, where: str | os.PathLike, override: bool = False) -> None:
    """Refuse a store made before whose level-0 pixel size is not what a conversion asked
    for `mpp` (and `override`) would record (`tilestore.reading.resolution.check_made`): a
    store is reused, never remade quietly, and never read at another resolution than the one
    asked for; nothing asked takes a store made without an override as it is."""
    check_made(slide.record.mpp, mpp, override, where)


def slides_of(path: str | os.PathLike) -> list[str | None]:
    """The DICOM series to convert from `path`, one store each: a folder holding several
    series gives their SeriesInstanceUIDs; anything else is one slide ([None])."""
    if not Path(path).is_dir():
        return [None]
    try:
        found = dicom_series(path)
    except TilestoreError:
        return [None]  # open_source says what is wrong with it
    return list(found) if len(found) > 1 else [None]


def _read_block(
    array: zarr.Array, y0: int, y1: int, x0: int, x1: int, source: Source, enc: _Encoding
) -> np.ndarray:
    """Pixels [y0:y1, x0:x1] of a level just written (or read in place), as (h, w, c), to
    build the next: through zarr's decoders on its threads. A tile that does not decode (a
    source tile damaged in its JPEG headers, copied as it was) is found by reading the block
    chunk by chunk, and named: a SlideError, never the decoder's own error."""
    y1, x1 = min(y1, array.shape[1]), min(x1, array.shape[2])
    try:
        return np.moveaxis(array[:, y0:y1, x0:x1], 0, -1)
    except (RuntimeError, ValueError) as exc:  # imagecodecs' errors are RuntimeErrors
        reader = ChunkReader(array, enc.background, str(source.path))
        try:
            reader.read(y0, y1, x0, x1)
        except ChunkError as named:
            raise SlideError(f"{named}: the slide's own tile is damaged") from exc
        raise SlideError(
            f"{source.path}: level {array.path} rows {y0}-{y1}, columns {x0}-{x1} cannot be "
            "decoded "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _jpeg_levels(source: Source, enc: _Encoding) -> frozenset[int]:
    """The source levels whose JPEG tiles a sidecar's chunks can be as they are; the others
    are decoded from the slide at each read (`DecodedChunks`), never copied."""
    if enc.codec != "jpeg" or not enc.copy:
        return frozenset()
    return frozenset(
        index
        for index, level in enumerate(source.levels)
        if (tiles := level.jpeg_tiles()) is not None and tiles.tile_shape == (enc.chunk,) * 2
    )


def _in_place_facts(source: Source, enc: _Encoding) -> dict:
    """What a sidecar checks at every open: the slide's path and fingerprint, and which of
    its levels are read from it (none for a converted store)."""
    if not enc.in_place:
        return {}
    return {
        "path": str(source.path.resolve()),
        "fingerprint": fingerprint(source, enc.in_place),
        "in_place": sorted(enc.in_place),
        "decoded": sorted(enc.decoded),
        "tile_crc32c": TILE_SUMS_SAID,  # each tile checked by content at every read
    }


def _resolve_mpp(source: Source, mpp: float | None, override: bool) -> tuple[Mpp | None, list[str]]:
    """Return the level-0 pixel size to store (`settle_mpp`: the file's, one given where it
    states none, or an override) and the warnings to give; OptionError where a size given
    disagrees with the file's without `override`."""
    found = source.info.mpp
    stated = None if found is None else Mpp(*found.value, found.origin)
    settled = settle_mpp(stated, mpp, override, source.path)
    notes = list(source.info.warnings)
    if settled is None:
        notes.append("no pixel size (mpp) in the file; stored mpp: null (set it with mpp=<um/px>)")
    return settled, notes


def _create_arrays(root: zarr.Group, source: Source, plan: list, enc: _Encoding) -> list:
    first = source.levels[0]
    return [
        root.create_array(
            str(index),
            shape=(first.channels, *shape),
            dtype=first.dtype,
            fill_value=enc.background,
            dimension_names=("c", "y", "x"),
            # every chunk is written, background ones too: a chunk missing is damage
            config={"write_empty_chunks": True},
            **_layout(source, index, (first.channels, *shape), enc),
        )
        for index, (shape, _, _) in enumerate(plan)
    ]


def _layout(source: Source, index: int, shape: tuple[int, ...], enc: _Encoding) -> dict:
    """A level's chunks, shards and codecs as ``create_array`` arguments. A level read in
    place is not sharded: its chunks are the slide's tiles, named one by one."""
    first = source.levels[0]
    chunks = (first.channels if first.channels <= 4 else 1, enc.chunk, enc.chunk)
    codecs = _codec_args(source, index, enc)
    if not enc.shard or index in enc.in_place:
        return {"chunks": chunks, **codecs}
    chunk_bytes = shape[0] * enc.chunk**2 * np.dtype(first.dtype).itemsize  # all channels
    shard = shard_shape(chunks, shape, enc.shard, chunk_bytes)
    return sharded(codecs, chunks, shard, enc.checksums)


def _write_levels(
    source: Source,
    arrays: list,
    plan: list,
    root: Path,
    enc: _Encoding,
    report: ConversionReport,
    progress: Callable[[int, int], None] | None,
    written: Callable[[int], None] | None = None,
) -> None:
    """Write (or, in place, describe) every level, coarse first (`write_order`); written:
    told of each level's index once it can be read. The report lists them by index."""
    total = sum(-(-h // enc.chunk) * -(-w // enc.chunk) for (h, w), _, _ in plan)

    def advance(n: int) -> None:
        if progress:
            progress(n, total)

    for index in write_order(len(source.levels), len(plan)):
        array, (_, downsample, origin) = arrays[index], plan[index]
        started = time.perf_counter()
        level = LevelReport(str(index), array.shape, downsample, origin, "", "")
        if index in enc.decoded:
            level.write, level.reason = "in place", "decoded from the slide at each read"
        elif index in enc.in_place:
            level.write, level.reason = "in place", "JPEG tiles read from the slide file"
        elif index < len(source.levels):
            where = f"{source.path}: level {index}"
            _write_source_level(source.levels[index], array, root, level, enc, advance, where)
        else:
            previous = arrays[index - 1]

            def read_half(y0: int, y1: int, x0: int, x1: int, previous=previous) -> np.ndarray:
                return downsample2(
                    _read_block(previous, 2 * y0, 2 * y1, 2 * x0, 2 * x1, source, enc)
                )

            level.write = "lossless" if enc.codec == "zstd" else "re-encode"
            level.reason = f"2x2 box average of level {index - 1}"
            level.chunks = _write_blocks(array, read_half, advance, level, enc)
        level.seconds = time.perf_counter() - started
        report.levels.append(level)
        if written:
            written(index)
    report.levels.sort(key=lambda level: int(level.path))


def write_order(source_levels: int, levels: int) -> list[int]:
    """The order levels are written in: the slide's coarsest, the levels built from it,
    then the slide's finer ones, coarse to fine. A tissue mask reads a coarse level, and
    level 0 is most of the bytes: the mask is made while level 0 is copied (`convert`'s
    tissue). Each level is written from the slide, or from the one before it (built)."""
    last = source_levels - 1
    return [*range(last, levels), *range(last - 1, -1, -1)]


def _write_source_level(
    level: SourceLevel,
    array: zarr.Array,
    root: Path,
    report: LevelReport,
    enc: _Encoding,
    advance: Callable[[int], None],
    where: str,
) -> None:
    jpeg = enc.codec == "jpeg"
    tiles = level.jpeg_tiles() if enc.copy and jpeg else None
    if tiles is not None and tiles.tile_shape == tuple(array.chunks[1:]):
        report.write = "copy"
        report.reason = f"{tiles.color_space} JPEG tiles {tiles.tile_shape[1]} px copied verbatim"
        report.chunks, report.reencoded = copy_tiles(
            array,
            root,
            tiles,
            level,
            array.serializer,
            enc.background,
            enc.workers,
            advance,
            where,
        )
        if report.reencoded:
            report.reason += f"; {report.reencoded} odd tiles re-encoded"
            report.lossy = True
        return
    if not jpeg:
        report.write, report.reason = "lossless", "zstd"
    elif not enc.copy:
        report.write, report.reason = "re-encode", "copy disabled"
    elif tiles is not None:
        report.write = "re-encode"
        report.reason = f"source tiles {tiles.tile_shape} differ from chunks {array.chunks[1:]}"
    else:
        report.write, report.reason = "re-encode", level.describe_copy()
    report.chunks = _write_blocks(array, level.read, advance, report, enc)


def _write_blocks(
    array: zarr.Array,
    read: Callable[[int, int, int, int], np.ndarray],
    advance: Callable[[int], None],
    report: LevelReport,
    enc: _Encoding,
) -> int:
    """Write a level through zarr's encoder (`write_blocks`); a JPEG level's loss is measured
    on a sample of its chunks as they are written, and said in its report."""
    loss = Loss.sample(array) if enc.codec == "jpeg" else None
    chunks = write_blocks(array, read, advance, loss)
    if loss is not None:
        report.lossy, report.psnr, report.sampled = True, loss.psnr, loss.sampled
    return chunks


def _write_attrs(
    root: zarr.Group,
    source: Source,
    plan: list,
    enc: _Encoding,
    report: ConversionReport,
    mpp: Mpp | None,
    associated: list[str],
    sha256: str,
) -> None:
    first = source.levels[0]
    rgb = enc.background == 255
    labels, colors = _channels(source, enc)
    windows = None if rgb else _display_windows(root[str(len(plan) - 1)])
    mpp_xy = (mpp.x, mpp.y) if mpp else None
    root.attrs["ome"] = {
        "version": omezarr.OME_VERSION,
        "multiscales": omezarr.multiscales(
            source.path.name, [str(i) for i in range(len(plan))], [p[1] for p in plan], mpp_xy
        ),
        "omero": omezarr.omero(labels, _dtype_max(first.dtype), rgb, colors, windows),
    }
    levels = [{k: v for k, v in asdict(lv).items() if k != "seconds"} for lv in report.levels]
    others = {
        "store_format": STORE_FORMAT,
        "objective_power": Fact.to_json(source.info.objective_power),
        "codec": {
            "name": enc.codec,
            "reason": enc.reason,
            "quality": report.quality,
            "lossy": report.lossy,  # each level's loss: its lossy, psnr and sampled
        },
        "associated": associated,
        "software": software_versions("tifffile", "imagecodecs"),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    record = _record(
        source,
        enc,
        mpp,
        tuple(LevelRecord(lv["path"], tuple(lv["downsample"]), lv) for lv in levels),
        others,
        sha256,
    )
    write_record(root, record)


def _channels(source: Source, enc: _Encoding) -> tuple[list[str], list | None]:
    """The channels' names and colours the store declares."""
    info, first = source.info, source.levels[0]
    declared = info.channels if info.channels and len(info.channels) == first.channels else None
    names = [c.name for c in declared or ()]
    labels = omezarr.channel_labels(first.channels, enc.background == 255, names)
    return labels, [c.color for c in declared] if declared else None


def _plan_levels(plan: list) -> tuple[LevelRecord, ...]:
    """The levels a store of this plan records, before they are written (no reports yet)."""
    return tuple(LevelRecord(str(i), downsample, {}) for i, (_, downsample, _) in enumerate(plan))


def _record(
    source: Source,
    enc: _Encoding,
    mpp: Mpp | None,
    levels: tuple[LevelRecord, ...],
    others: dict,
    sha256: str | None,
) -> StoreRecord:
    """What the store says of itself: complete once the slide's hash is known (the last
    thing written); before, the record the tissue mask beside the conversion reads by."""
    info, first = source.info, source.levels[0]
    checksum = "crc32c" if enc.checksums else None
    if checksum and enc.in_place:
        checksum += ", built levels only"  # a slide's own tiles carry none
    # recorded as the levels were written (`tilestore.conversion.levels`)
    tied = {"positions": positions.declaration(bool(enc.in_place))} if enc.checksums else {}
    facts = {
        "name": source.path.name,
        "format": info.format,
        "vendor": info.vendor,
        "size": source.size(),
        "mtime_ns": source.mtime_ns(),  # with the size: the same file, unread (a rerun)
        "files": len(source.files),
        **({"series": info.series} if info.series else {}),
        **({"sha256": sha256} if sha256 else {}),
        # how the slide stores level 0: lossless, lossy or not said, and where it says so
        "lossless": Fact.to_json(first.lossless),
        **_in_place_facts(source, enc),
    }
    labels, _ = _channels(source, enc)
    return StoreRecord(
        levels=levels,
        # written last (`StoreRecord.to_attrs`): without it, interrupted
        complete=sha256 is not None,
        mpp=mpp,
        channels=tuple(labels),
        rgb=first.rgb,  # one colour picture's R, G, B (not independent channels)
        modality=Fact.to_json(info.modality),
        background=enc.background,
        # what a reader may rely on: every chunk written, each with its CRC-32C, each
        # CRC-32C recorded by the chunk's position
        integrity=Integrity(True, checksum, tied.get("positions")),
        source=SourceRecord.of(facts),
        others=others,
    )


def _level_plan(source: Source) -> list[tuple[tuple[int, int], tuple[float, float], str]]:
    """Return (shape, downsample, origin) per store level: source levels, then 2x levels."""
    h0, w0 = source.levels[0].shape
    plan = [
        (level.shape, (h0 / level.shape[0], w0 / level.shape[1]), f"source level {i}")
        for i, level in enumerate(source.levels)
    ]
    while max(plan[-1][0]) > SMALLEST_LEVEL:
        (h, w), (dy, dx), _ = plan[-1]
        plan.append(
            ((-(-h // 2), -(-w // 2)), (dy * 2, dx * 2), f"built from level {len(plan) - 1}")
        )
    return plan


def choose_codec(source: Source, codec: str = "auto", lossy_ok: bool = False) -> tuple[str, str]:
    """The codec a conversion writes and why.

    Asked for: zstd always; JPEG for 8-bit pixels, and for anything but RGB brightfield only
    with `lossy_ok`. "auto": JPEG only for 8-bit RGB brightfield whose level 0 the slide
    stores lossy (its JPEG tiles are then copied as they are, and only the levels built are
    encoded); zstd for everything else. A slide stored losslessly stays lossless, and so does
    one whose file does not say how it is stored: JPEG from it would be a loss the slide
    never had, made unasked (`SourceLevel.lossless` says what the file says)."""
    level = source.levels[0]
    if codec not in CODECS:
        raise OptionError(f"codec={codec!r}: choose one of {', '.join(map(repr, CODECS))}")
    jpeg_ok = level.dtype == np.uint8 and level.channels in (1, 3)
    if codec == "jpeg":
        if not jpeg_ok:
            raise OptionError(
                f"{source.path}: codec='jpeg' needs 8-bit RGB or grayscale, not "
                f"{source.describe_pixels()}; use codec='zstd'"
            )
        if not source.brightfield_rgb and not lossy_ok:
            raise OptionError(
                f"{source.path}: codec='jpeg' would quantise {source.describe_pixels()}, which "
                "are not 8-bit RGB brightfield; store them losslessly (codec='auto') or pass "
                "lossy_ok=True"
            )
        return "jpeg", "asked for" + ("" if source.brightfield_rgb else ", lossy_ok")
    if codec == "zstd":
        return "zstd", "asked for"
    if not source.brightfield_rgb:
        modality = source.info.modality
        if modality is not None and modality.value == "fluorescence":
            return "zstd", f"fluorescence ({modality.origin})"
        return "zstd", f"{source.describe_pixels()}, not 8-bit RGB brightfield"
    stored = level.lossless
    if stored.value is False:
        return "jpeg", f"8-bit RGB brightfield stored lossy: {stored.origin}"
    if stored.value:
        return "zstd", f"stored losslessly, kept lossless: {stored.origin}"
    return (
        "zstd",
        f"not known to be stored lossy, kept lossless (the safe default): {stored.origin}",
    )


def _choose_chunk(source: Source, chunk: int | None, copy: bool) -> int:
    if chunk is not None:  # its range is declared (`convert`'s chunk)
        return chunk
    tiles = source.levels[0].jpeg_tiles() if copy else None
    if tiles and tiles.tile_shape[0] == tiles.tile_shape[1] and 128 <= tiles.tile_shape[0] <= 1024:
        return tiles.tile_shape[0]
    return 256


def _codec_args(source: Source, index: int, enc: _Encoding) -> dict:
    """Return create_array codec arguments for a level; copied levels declare their tiles' JPEG."""
    if index in enc.decoded:  # chunks are the slide's pixels, decoded as they are read
        return {"serializer": BytesCodec(), "compressors": None, "filters": None}
    if enc.codec == "zstd":
        return zstd_codecs(checksums=enc.checksums)
    if source.levels[0].channels == 1:
        raise OptionError(f"{source.path}: grayscale JPEG stores are not supported; use zstd")
    tiles = source.levels[index].jpeg_tiles() if enc.copy and index < len(source.levels) else None
    crc = enc.checksums and index not in enc.in_place  # the slide's tiles carry no CRC
    if tiles is not None and tiles.color_space == "rgb":
        return jpeg_codecs(enc.quality, "rgb", checksums=crc)
    if tiles is not None:
        return jpeg_codecs(enc.quality, "ycbcr", [list(f) for f in tiles.subsampling], crc)
    if not source.brightfield_rgb:
        # Fluorescence channels are not colours: no YCbCr mixing, no chroma subsampling.
        return jpeg_codecs(enc.quality, "rgb", checksums=crc)
    return jpeg_codecs(enc.quality, "ycbcr", enc.subsampling, crc)


def _write_associated(source: Source, root: zarr.Group) -> list[str]:
    group = root.require_group("associated")
    for name, load in source.associated.items():
        image = load()
        image = image[..., None] if image.ndim == 2 else image
        group.create_array(
            name, data=np.moveaxis(image, -1, 0), dimension_names=("c", "y", "x"), **zstd_codecs()
        )
    return sorted(source.associated)


def _check_target(target: Path, overwrite: bool) -> None:
    for note in leftovers.clear(target):
        warnings.warn(note, TilestoreWarning, stacklevel=3)
    if target.exists():
        if not is_store(target):  # never replaced: it may be anything of the user's
            kind = "a folder" if target.is_dir() else "a file"
            raise StoreError(
                f"{target}: {kind} that is not a tilestore store is in the store's place; "
                "move it or choose another output"
            )
        if not overwrite:
            raise StoreError(f"{target}: already exists; pass overwrite=True to replace it")
        locks.refuse_while_written(target, "replacing it (overwrite=True)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{target}: cannot create output directory: {exc.strerror}") from exc
    if not os.access(target.parent, os.W_OK):
        raise StoreError(f"{target}: output directory {target.parent} is not writable")


def converted_store(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    series: str | None = None,
    name: str | None = None,
) -> Path | str:
    """The store `convert(src, dst, series=..., name=...)` makes: dst itself where it names
    a .zarr, else <name>.ome.zarr in dst (`_store_name`); in a bucket (dst a URL), its URL."""
    if isinstance(dst, str) and is_url(dst):  # a bucket's (`tilestore.conversion.bucket`)
        return store_url(dst, _store_name(_named_by(src), series, name))
    if Path(dst).suffix == ".zarr":
        return Path(dst)
    return Path(dst) / _store_name(_named_by(src), series, name)


def _named_by(src: str | os.PathLike) -> str | os.PathLike:
    """What a store is named after: a URL's path (its last step; a signed URL's query
    aside), a DICOMweb series' URL (by its UID: `store_name`), else `src`."""
    return urlsplit(str(src)).path if is_url(src) and not is_dicomweb(src) else src


def _store_name(src: str | os.PathLike, series: str | None, name: str | None) -> str:
    """<name>.ome.zarr: as asked, else the slide file's stem or the DICOM folder's name (with
    the series UID where the folder holds several series)."""
    if name:
        return name + STORE_SUFFIX
    if series:
        return f"{Path(src).name}-{series}{STORE_SUFFIX}"
    return Path(src).name + STORE_SUFFIX if Path(src).is_dir() else store_name(src)


def _display_windows(smallest: zarr.Array) -> list[tuple[float, float]]:
    """Each channel's 0.1-99.9th percentile on the smallest level: a display window that
    shows a dim 16-bit marker, where the dtype's whole range would show it black."""
    pixels = smallest[:]
    windows = []
    for channel in pixels.reshape(pixels.shape[0], -1):
        low, high = np.percentile(channel, [0.1, 99.9])
        windows.append((_plain(low), _plain(max(high, low + 1))))
    return windows


def _plain(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(float(value), 3)


def _dtype_max(dtype: np.dtype) -> int | float:
    return int(np.iinfo(dtype).max) if dtype.kind in "ui" else 1.0
