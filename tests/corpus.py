"""Damaged and odd inputs made from the real files: what a hostile user or a bad disk hands us.

Each maker writes one input under `folder` and returns its path. The cases that use them
(tests/test_hostile.py) say what must come out: one clean error of the right kind naming
the file and the cause, or a right result; never a hang, a traceback or a silent wrong answer.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import tifffile
import zarr

from tests.conftest import group_of
from tests.tilestore.tiffs import patch_tag
from tilestore.format import positions
from tilestore.format.integrity import UNWRITTEN
from tilestore.format.shards import ABSENT, chunks_per_shard, index_checked, pack, parse_index

# -- slide files ------------------------------------------------------------------------------


def empty(folder: Path, svs: Path) -> Path:
    path = folder / "empty.svs"
    path.write_bytes(b"")
    return path


def text(folder: Path, svs: Path) -> Path:
    path = folder / "notes.svs"
    path.write_text("patient notes, not a slide\n" * 20)
    return path


def truncated(at: int) -> Callable[[Path, Path], Path]:
    def make(folder: Path, svs: Path) -> Path:
        path = folder / f"truncated-{at}.svs"
        data = svs.read_bytes()
        path.write_bytes(data[:at])
        return path

    make.__name__ = f"truncated_{at}"
    return make


def directory(folder: Path, svs: Path) -> Path:
    path = folder / "a-folder.svs"
    path.mkdir()
    return path


def fifo(folder: Path, svs: Path) -> Path:
    path = folder / "pipe.svs"
    os.mkfifo(path)
    return path


def symlink(folder: Path, svs: Path) -> Path:
    path = folder / "linked.svs"
    path.symlink_to(svs)
    return path


def dangling(folder: Path, svs: Path) -> Path:
    path = folder / "dangling.svs"
    path.symlink_to(folder / "gone.svs")
    return path


def tiff_magic_garbage(folder: Path, svs: Path) -> Path:
    path = folder / "garbage.tif"
    path.write_bytes(b"II*\x00" + bytes(range(256)) * 64)
    return path


def page_loop(back_to: int, at: int = 0) -> Callable[[Path, Path], Path]:
    """The real classic TIFF whose page `at` declares page `back_to` (itself, or one before)
    as the next page: a loop in the chain of image headers."""

    def make(folder: Path, svs: Path) -> Path:
        data = bytearray(svs.read_bytes())
        assert data[:4] == b"II*\x00"  # classic little-endian: 4-byte offsets
        offsets = [struct.unpack_from("<I", data, 4)[0]]
        while True:
            tags = struct.unpack_from("<H", data, offsets[-1])[0]
            next_at = offsets[-1] + 2 + 12 * tags
            if len(offsets) == at + 1:
                struct.pack_into("<I", data, next_at, offsets[back_to])
                break
            offsets.append(struct.unpack_from("<I", data, next_at)[0])
        path = folder / f"page-loop-{at}-to-{back_to}.svs"
        path.write_bytes(bytes(data))
        return path

    make.__name__ = f"page_loop_{at}_to_{back_to}"
    return make


def tag(name: str, value: int) -> Callable[[Path, Path], Path]:
    def make(folder: Path, svs: Path) -> Path:
        return patch_tag(svs, folder / f"{name}-{value}.svs", name, value)

    make.__name__ = f"{name}_{value}"
    return make


def geometry(kind: str, name: str, value: int, page: int = 0) -> Callable[[Path, Path], Path]:
    """A TIFF whose page `page` declares an impossible `name` (TileWidth 0, RowsPerStrip 0,
    ImageWidth 0): the real SVS ("svs": page 2 is its label), or a small tiled or striped
    TIFF of its pixels ("tiled", "striped"). tifffile divides by these sizes."""

    def make(folder: Path, svs: Path) -> Path:
        src = svs
        if kind != "svs":
            src = folder / f"{kind}.tif"
            pixels = tifffile.imread(svs)[:700, :900]
            layout = {"tile": (240, 240)} if kind == "tiled" else {"rowsperstrip": 64}
            tifffile.imwrite(src, pixels, photometric="rgb", compression="zlib", **layout)
        return patch_tag(src, folder / f"{kind}-{name}-{value}.tif", name, value, page)

    make.__name__ = f"{kind}_{name}_{value}"
    return make


def dicom_attribute(name: str, value: int) -> Callable[[Path, Path], Path]:
    """The real DICOM file with one attribute changed (Columns 0: frames 0 px wide)."""

    def make(folder: Path, dcm: Path) -> Path:
        import pydicom

        ds = pydicom.dcmread(dcm)
        setattr(ds, name, value)
        path = folder / f"{name}-{value}.dcm"
        ds.save_as(path)
        return path

    make.__name__ = f"dicom_{name}_{value}"
    return make


def dicom_without(name: str) -> Callable[[Path, Path], Path]:
    """The real DICOM file without one attribute (as a non-conformant exporter writes it)."""

    def make(folder: Path, dcm: Path) -> Path:
        import pydicom

        ds = pydicom.dcmread(dcm)
        delattr(ds, name)
        path = folder / f"no-{name}.dcm"
        ds.save_as(path)
        return path

    make.__name__ = f"dicom_without_{name}"
    return make


def _tile_bytes(svs: Path, index: int) -> tuple[int, int]:
    with tifffile.TiffFile(svs) as tif:
        page = tif.pages.first
        return page.dataoffsets[index], page.databytecounts[index]


def tile_damage(kind: str, index: int = 40) -> Callable[[Path, Path], Path]:
    """One JPEG tile of level 0 zeroed, bit-flipped in its scan data or in a marker segment's
    length (its headers: read as a frame, it fails to decode), or without SOI."""

    def make(folder: Path, svs: Path) -> Path:
        data = bytearray(svs.read_bytes())
        offset, count = _tile_bytes(svs, index)
        if kind == "zeroed":
            data[offset : offset + count] = bytes(count)
        elif kind == "no-soi":
            data[offset : offset + 2] = b"\x00\x00"
        elif kind == "header-bitflip":  # byte 4: the first segment's length, high bit
            data[offset + 4] ^= 0x80
        elif kind == "bitflip":
            for at in range(offset + count // 2, offset + count - 16, 97):
                data[at] ^= 0x5A
        path = folder / f"tile-{kind}.svs"
        path.write_bytes(bytes(data))
        return path

    make.__name__ = f"tile_{kind}"
    return make


def jpegtables_zeroed(folder: Path, svs: Path) -> Path:
    data = bytearray(svs.read_bytes())
    with tifffile.TiffFile(svs) as tif:
        t = tif.pages.first.tags["JPEGTables"]
        data[t.valueoffset : t.valueoffset + t.count] = bytes(t.count)
    path = folder / "tables-zeroed.svs"
    path.write_bytes(bytes(data))
    return path


def jpeg_frame_size(folder: Path, jpg: Path, height: int = 65500, width: int = 65500) -> Path:
    """A real JPEG whose frame header (SOF0) declares another size."""
    data = bytearray(jpg.read_bytes())
    at = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, at + 5, height, width)
    path = folder / f"frame-{height}x{width}.jpg"
    path.write_bytes(bytes(data))
    return path


def png_size(folder: Path, png: Path, height: int = 65500, width: int = 65500) -> Path:
    """A real PNG whose IHDR declares another size (its CRC fixed, as a crafted file has it)."""
    import zlib

    data = bytearray(png.read_bytes())
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    path = folder / f"ihdr-{height}x{width}.png"
    path.write_bytes(bytes(data))
    return path


# -- stores -------------------------------------------------------------------------------------


def store_copy(folder: Path, store: Path, name: str) -> Path:
    target = folder / f"{name}.ome.zarr"
    shutil.copytree(store, target)
    return target


def chunk_file(store: Path, level: str = "0", row: int = 2, col: int = 3) -> Path:
    """The file holding chunk (row, col) of a level: its shard (or itself, unsharded)."""
    array = zarr.open_array(store / level, mode="r")
    if array.shards is None:
        return store / level / "c" / "0" / str(row) / str(col)
    _, per_r, per_c = chunks_per_shard(array)
    return store / level / "c" / "0" / str(row // per_r) / str(col // per_c)


def rewrite_chunk(
    store: Path,
    change: Callable[[bytes], bytes | None],
    level: str = "0",
    row: int = 2,
    col: int = 3,
) -> None:
    """Replace the stored bytes of chunk (row, col) with change(its bytes) (None: absent),
    in its shard (its index rewritten to match) or its own file; the level's positions, where
    the store records them, say so too: the store reads as if written with these bytes
    (damaged before it was written, or by a tool that keeps positions in step)."""
    array = zarr.open_array(store / level, mode="r")
    path = chunk_file(store, level, row, col)
    if array.shards is None:
        new = change(path.read_bytes())
        path.unlink()
        if new is not None:
            path.write_bytes(new)
    else:
        per = chunks_per_shard(array)[1:]
        data = path.read_bytes()
        index = parse_index(data, per[0] * per[1], str(path), index_checked(array))
        chunks = [None if o == ABSENT else data[int(o) : int(o) + int(n)] for o, n in index]
        inner = (row % per[0]) * per[1] + col % per[1]
        chunks[inner] = new = change(chunks[inner])
        path.write_bytes(pack(chunks, index_checked(array)))
    recorded = store / positions.path_of(level)
    if (recorded / "zarr.json").exists() and (new is None or len(new) >= 4):
        table = zarr.open_array(recorded, mode="r+")
        table[0, row, col] = UNWRITTEN if new is None else int.from_bytes(new[-4:], "little")


def damage_chunk(kind: str, row: int = 2, col: int = 3) -> Callable[[Path, Path], Path]:
    """A store with one chunk of level 0 garbage, empty, truncated or missing (in its shard),
    or with the file holding it (its shard) a link to another, a folder or a FIFO."""

    def make(folder: Path, store: Path) -> Path:
        target = store_copy(folder, store, f"chunk-{kind}")
        chunk = chunk_file(target, row=row, col=col)
        if kind in ("symlink", "folder", "fifo"):
            other = target / "1" / "c" / "0" / "0" / "0"  # another level's first file
            chunk.unlink()
            if kind == "symlink":
                chunk.symlink_to(other)
            elif kind == "folder":
                chunk.mkdir()
            else:
                os.mkfifo(chunk)
            return target

        def change(data: bytes) -> bytes | None:
            if kind == "garbage":
                return bytes(range(256)) * (len(data) // 256 + 1)
            if kind == "empty":
                return b""
            if kind == "truncated":
                return data[: len(data) // 2]
            if kind == "bitflip":
                flipped = bytearray(data)
                flipped[len(data) // 2] ^= 0x01
                return bytes(flipped)
            return None  # missing

        rewrite_chunk(target, change, row=row, col=col)
        return target

    make.__name__ = f"chunk_{kind}"
    return make


def corrupt_json(part: str) -> Callable[[Path, Path], Path]:
    """A store whose zarr.json at `part` ("" root, "0" a level, "plans/x") is not JSON."""

    def make(folder: Path, store: Path) -> Path:
        target = store_copy(folder, store, "json-" + (part.replace("/", "-") or "root"))
        meta = target / part / "zarr.json"
        meta.write_text(meta.read_text()[: len(meta.read_text()) // 2])
        return target

    make.__name__ = f"json_{part or 'root'}"
    return make


def array_json(part: str, name: str, edit: Callable[[dict], None]) -> Callable[[Path, Path], Path]:
    """A store whose zarr.json at `part` is JSON, edited (a key dropped, a value changed)."""

    def make(folder: Path, store: Path) -> Path:
        target = store_copy(folder, store, f"meta-{name}")
        meta = target / part / "zarr.json"
        doc = json.loads(meta.read_text())
        edit(doc)
        meta.write_text(json.dumps(doc))
        return target

    make.__name__ = f"meta_{name}"
    return make


def attrs_edit(name: str, edit: Callable[[dict], None]) -> Callable[[Path, Path], Path]:
    """A store whose root tilestore attributes were edited (keys dropped, values changed)."""

    def make(folder: Path, store: Path) -> Path:
        target = store_copy(folder, store, f"attrs-{name}")
        meta = target / "zarr.json"
        doc = json.loads(meta.read_text())
        edit(doc["attributes"]["tilestore"])
        meta.write_text(json.dumps(doc))
        return target

    make.__name__ = f"attrs_{name}"
    return make


# -- finished embeddings -------------------------------------------------------------------------

# what a finished embeddings group is damaged with: a NaN, infinities, features' zarr.json
# edited to fewer rows than the group records
EMBEDDINGS_DAMAGE = ("nan", "inf", "rows")
DAMAGED_ROWS = (3, 20)  # the tile rows "nan" and "inf" write into


def damage_embeddings(store: Path, model: str, kind: str) -> str:
    """Damage the finished `model` group of `store` in place as `kind` (EMBEDDINGS_DAMAGE)
    says, with zarr or by editing one document (nothing else recomputed); return what a
    reader's refusal says of it."""

    group = store / group_of(store, model)
    if kind == "rows":
        shape_edited(group / "features", 3)
        width = json.loads((group / "features" / "zarr.json").read_text())["shape"][1]
        return f"features has shape (3, {width}) where the group records"
    features = zarr.open_array(group / "features", mode="r+")
    for i, row in enumerate(DAMAGED_ROWS):
        features[row, 5 + i] = {"nan": float("nan"), "inf": (-1) ** i * float("inf")}[kind]
    record = json.loads((group / "zarr.json").read_text())["attributes"]["tilestore"]
    if "positions" in record:  # tied: their chunks, rewritten, are not the ones written there
        chunk = features.chunks[0]
        chunks = sorted({row // chunk for row in DAMAGED_ROWS})
        spans: list[list[int]] = []
        for c in chunks:
            if spans and spans[-1][1] == c - 1:
                spans[-1][1] = c
            else:
                spans.append([c, c])
        rows = ", ".join(f"{a * chunk}-{(b + 1) * chunk - 1}" for a, b in spans)
        return f"features: rows {rows} are not as written ({len(chunks)} chunk"
    rows = ", ".join(map(str, DAMAGED_ROWS))
    return f"features holds NaN or infinite values in 2 tile row(s) ({rows})"


def shape_edited(array: Path, rows: int) -> None:
    """An array's zarr.json edited to `rows` rows (its chunks left as they are)."""
    meta = array / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"][0] = rows
    meta.write_text(json.dumps(doc))


# -- annotations --------------------------------------------------------------------------------

SQUARE = [[100.0, 100.0], [900.0, 100.0], [900.0, 900.0], [100.0, 900.0], [100.0, 100.0]]


def geojson(name: str, text_: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / f"{name}.geojson"
        path.write_text(text_)
        return path

    make.__name__ = f"geojson_{name}"
    return make


def polygon_geojson(coords: str) -> str:
    return (
        '{"type": "Feature", "properties": {"classification": {"name": "Tumor"}}, '
        f'"geometry": {{"type": "Polygon", "coordinates": [{coords}]}}}}'
    )


def aperio(name: str, vertices: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / f"{name}.xml"
        path.write_text(
            '<?xml version="1.0"?>\n<Annotations MicronsPerPixel="0.5"><Annotation Id="1">'
            '<Regions><Region Id="1"><Vertices>'
            f"{vertices}</Vertices></Region></Regions></Annotation></Annotations>"
        )
        return path

    make.__name__ = f"aperio_{name}"
    return make


def asap(name: str, coordinates: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / f"{name}.xml"
        path.write_text(
            '<?xml version="1.0"?>\n<ASAP_Annotations><Annotations>'
            '<Annotation Name="a" Type="Polygon" PartOfGroup="Tumor"><Coordinates>'
            f"{coordinates}</Coordinates></Annotation></Annotations></ASAP_Annotations>"
        )
        return path

    make.__name__ = f"asap_{name}"
    return make


def vertices(points, fmt="{:g}") -> str:
    return "".join(f'<Vertex X="{fmt.format(x)}" Y="{fmt.format(y)}"/>' for x, y in points)
