"""A slide read in place is checked by content: its sidecar records the CRC-32C of each of
its tiles as the file stores them, and a tile rewritten in place (same size, so the same
fingerprint) is refused on every read and named by `verify`, never read as other pixels;
a sidecar made before reads as it did; `verify` writes nothing into the store it checks."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest
import tifffile
import zarr

from tests.conftest import CMU, NDPI, run_cli
from tilestore.conversion import describe, open_in_place
from tilestore.conversion.converter import convert
from tilestore.errors import ChunkError
from tilestore.format.integrity import read_chunks
from tilestore.reading import open_slide, sidecar_for, verify_store
from tilestore.reading.inplace import TILE_SUMS

TILE = (4, 5)  # a tissue tile of CMU-1-Small-Region (10 tiles across)


def _flip(path, index: int, page: int = 0, at: float = 0.5) -> None:
    """Flip 4 bytes in the middle of one tile's (or strip's) entropy-coded data, in place:
    the file's size and tile index (its fingerprint) stay as they were."""
    with tifffile.TiffFile(path) as tif:
        target = tif.pages[page]
        offset, count = target.dataoffsets[index], target.databytecounts[index]
    with open(path, "r+b") as fh:
        fh.seek(offset + int(count * at))
        data = fh.read(4)
        fh.seek(offset + int(count * at))
        fh.write(bytes(b ^ 0x55 for b in data))


@pytest.fixture
def svs(tmp_path, slide_path):
    copy = tmp_path / "archive" / CMU
    copy.parent.mkdir()
    shutil.copyfile(slide_path(CMU), copy)
    return copy


def _tree(folder) -> dict[str, tuple[str, int]]:
    """Every file under a folder: its SHA-256 and modification time."""
    return {
        str(p.relative_to(folder)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_tile_changed_in_place_is_refused_on_every_read(svs, tmp_path):
    """The issue's reproducer: 4 bytes flipped inside a tile's scan data still decode (to
    other pixels), so only the recorded CRC-32C can tell; every read path refuses the tile,
    naming the slide, the level and the tile, and reads the others as before."""
    sidecars = tmp_path / "sidecars"
    whole = open_in_place(svs, sidecars).read_region(0, 0, 2220, 2967, level=0)
    row, col = TILE
    _flip(svs, row * 10 + col)
    with tifffile.TiffFile(svs) as tif:  # the changed tile decodes: a silent change
        changed = tif.pages[0].asarray()
    assert (changed != whole).any(-1).sum() > 1000
    for slide in (open_in_place(svs, sidecars), open_slide(sidecar_for(svs, sidecars))):
        with pytest.raises(ChunkError) as caught:
            slide.read_region(0, 0, 2220, 2967, level=0)
        said = str(caught.value)
        assert said.startswith(f"{svs}: level 0 tile {TILE} has changed since its sidecar")
        assert "remove the sidecar to make it again" in said
        with pytest.raises(ChunkError, match=r"tile \(4, 5\) has changed"):
            slide.to_dask(0).compute()  # the lazy view too
        other = slide.read_region(0, 0, 960, 960, level=0)  # tiles (0-3, 0-3): unchanged
        np.testing.assert_array_equal(other, whole[:960, :960])


def test_the_decoder_processes_leave_a_changed_tile_to_the_reader(svs, tmp_path):
    """The engine's decoder processes read tiles by byte range (`locations`): each carries
    the CRC-32C recorded for its bytes, a changed one is not decoded there, and the
    level's reader, which the engine then asks, refuses it."""
    from tilestore.embed.procdecode import decode_chunks

    slide = open_in_place(svs, tmp_path / "sidecars")
    reader = slide.chunks(0)
    _flip(svs, TILE[0] * 10 + TILE[1])
    coords = [(4, 4), TILE]
    located = reader.locations(coords)
    assert all(at.whole for at in located)
    names = [reader.chunk_name(c) for c in coords]
    with pytest.raises(ChunkError, match=r"not the ones recorded"):
        read_chunks(located, names, required=False)
    assert read_chunks(located[:1], names[:1], required=False)[0] is not None
    shm = f"tilestore-test-{id(reader)}"
    shape = (reader.chunk_h, reader.chunk_w, 3)
    with open(f"/dev/shm/{shm}", "wb") as fh:
        fh.truncate(2 * int(np.prod(shape)))
    try:
        frame = reader.frame.as_json()
        as_json = [list(at) for at in located]
        _, left = decode_chunks(as_json, coords, shm, shape, 255, frame=frame)
    finally:
        os.unlink(f"/dev/shm/{shm}")
    assert left == [0, 1]  # the request handed back whole: the reader names the damage
    with pytest.raises(ChunkError, match=r"tile \(4, 5\) has changed"):
        reader.fetch_one(TILE)


def test_a_decoded_level_changed_in_place_is_refused(tmp_path, slide_path):
    """NDPI levels are decoded from the slide at each read (JPEG strips): the strips under a
    chunk are checked before it is decoded."""
    ndpi = tmp_path / NDPI
    shutil.copyfile(slide_path(NDPI), ndpi)
    slide = open_in_place(ndpi, tmp_path / "sidecars")
    assert slide.record.levels[0].facts["reason"] == "decoded from the slide at each read"
    before = slide.read_region(0, 0, 256, 256, level=0)
    _flip(ndpi, 300)  # strip 300 of 608 (8 rows each): rows 2400-2407
    again = open_in_place(ndpi, tmp_path / "sidecars")
    np.testing.assert_array_equal(again.read_region(0, 0, 256, 256, level=0), before)
    with pytest.raises(ChunkError, match=rf"{NDPI}: level 0 tile \(300, 0\) has changed"):
        again.read_region(0, 2400, 256, 256, level=0)


def test_verify_names_each_changed_tile(svs, tmp_path):
    """verify reads every tile's bytes, with or without decode, and names each changed one
    (one line each); the command exits 2, its damage-found code."""
    sidecars = tmp_path / "sidecars"
    open_in_place(svs, sidecars)
    store = sidecar_for(svs, sidecars)
    assert verify_store(store).ok
    _flip(svs, 45)
    _flip(svs, 101)
    for decode in (False, True):
        result = verify_store(store, decode=decode)
        assert [line.split(": ", 1)[1].split(" has")[0] for line in result.bad] == [
            "level 0 tile (4, 5)",
            "level 0 tile (10, 1)",
        ]
        assert result.chunks >= 130 and result.unsummed == []
    done = run_cli("verify", store)
    assert done.returncode == 2
    assert f"{svs}: level 0 tile (4, 5) has changed since its sidecar" in done.stderr
    assert "tile (10, 1) has changed" in done.stderr


def test_a_sidecar_made_before_still_reads(svs, tmp_path):
    """A sidecar made before tile checksums (none recorded, its record silent) opens and
    reads as it did, trusted by its fingerprint; info and verify say its tiles are not
    checked by content."""
    sidecars = tmp_path / "sidecars"
    made = open_in_place(svs, sidecars).read_region(0, 0, 2220, 2967, level=0)
    store = sidecar_for(svs, sidecars)
    root = zarr.open_group(store, mode="r+")
    attrs = dict(root.attrs["tilestore"])
    attrs["source"] = {k: v for k, v in attrs["source"].items() if k != "tile_crc32c"}
    root.attrs["tilestore"] = attrs
    in_place = attrs["source"]["in_place"]
    for index in in_place:
        shutil.rmtree(store / TILE_SUMS / str(index))
    slide = open_slide(store)
    np.testing.assert_array_equal(slide.read_region(0, 0, 2220, 2967, level=0), made)
    assert describe(store)["in_place_tiles"].startswith("not checked by content")
    result = verify_store(store)
    assert result.ok and result.unsummed == [str(i) for i in in_place]
    done = run_cli("verify", store)
    assert done.returncode == 0 and "not checked by content" in done.stdout
    fresh = open_in_place(svs, tmp_path / "new")
    assert describe(sidecar_for(svs, tmp_path / "new"))["in_place_tiles"].startswith(
        "checked by content"
    )
    assert fresh.record.source.tile_sums


def test_verify_writes_nothing(svs, tmp_path):
    """verify leaves the stores it checks byte for byte (and time for time) as they were,
    sound or damaged, so a read-only archive is checked as any other."""
    sidecars = tmp_path / "sidecars"
    open_in_place(svs, sidecars)
    converted = convert(svs, tmp_path / "stores").store
    stores = [sidecar_for(svs, sidecars), converted]
    before = [_tree(s) for s in stores]
    for store in stores:
        assert verify_store(store, decode=True).ok
    assert [_tree(s) for s in stores] == before
    _flip(svs, 45)
    assert not verify_store(stores[0]).ok
    assert run_cli("verify", *stores).returncode == 2
    assert [_tree(s) for s in stores] == before


def test_verify_of_a_read_only_store_goes_on(svs, tmp_path, monkeypatch):
    """A store whose files cannot be written (a read-only archive; root ignores permission
    bits, so writing is made to fail) is verified as sound, and so are the stores after it."""
    from zarr.storage import LocalStore

    first = convert(svs, tmp_path / "a").store
    second = convert(svs, tmp_path / "b").store

    async def refused(self, key, value, *args, **kwargs):
        raise OSError(30, "Read-only file system", str(self.root / key))

    monkeypatch.setattr(LocalStore, "set", refused)
    results = [verify_store(store) for store in (first, second)]
    assert all(r.ok for r in results) and results[1].chunks > 0


def test_changed_jpeg_tables_are_refused_at_open(svs, tmp_path):
    """What every tile of a level is decoded with lies outside the tiles (an SVS's shared
    JPEG tables): one quantisation value changed still decodes, every tile as other pixels,
    so the sidecar records its CRC-32C too and opening it then is refused, naming the level."""
    sidecars = tmp_path / "sidecars"
    whole = open_in_place(svs, sidecars).read_region(0, 0, 2220, 2967, level=0)
    with tifffile.TiffFile(svs) as tif:
        at = tif.pages.first.tags["JPEGTables"].valueoffset
    with open(svs, "r+b") as fh:
        fh.seek(at)
        assert fh.read(4) == b"\xff\xd8\xff\xdb"  # the tables start with a DQT segment
        fh.seek(at + 10)  # a value of the first table
        value = fh.read(1)[0]
        fh.seek(at + 10)
        fh.write(bytes([value + 1 if value < 255 else value - 1]))
    with tifffile.TiffFile(svs) as tif:  # it decodes, to other pixels
        assert (tif.pages.first.asarray() != whole).any()
    with pytest.raises(ChunkError, match=r"level 0: its JPEG tables .* have changed since"):
        open_in_place(svs, sidecars)


def test_verify_goes_on_after_a_store_it_cannot_open(svs, tmp_path):
    """A sidecar whose slide changed (its fingerprint: refused at open) is one error line;
    the stores after it are still checked, and the command exits 2."""
    sidecars = tmp_path / "sidecars"
    open_in_place(svs, sidecars)
    sound = convert(svs, tmp_path / "stores").store
    with open(svs, "ab") as fh:  # another size: not the slide the sidecar was made from
        fh.write(b"\0")
    done = run_cli("verify", sidecar_for(svs, sidecars), sound)
    assert done.returncode == 2
    assert "not the slide its sidecar" in done.stderr
    said = done.stdout.replace("\n", "")  # the console wraps long lines
    assert f"{sound}: " in said and said.endswith("all good")


def test_embed_of_a_slide_changed_in_place_fails_naming_the_tile(svs, tmp_path):
    """The engine reads in-place tiles through the same sources: a changed tile under the
    plan fails the slide in one line naming it, and no features of it are kept done."""
    from tilestore.embed.engine import embed
    from tilestore.embed.models import load_model
    from tilestore.embed.settings import Options
    from tilestore.plan import PlanOptions

    sidecars = tmp_path / "sidecars"
    open_in_place(svs, sidecars)
    _flip(svs, TILE[0] * 10 + TILE[1])
    report = embed(
        [svs],
        load_model("efficientnet-lite0"),
        plan=PlanOptions(mpp=0.5, tile=224, min_tissue=0),
        options=Options(batch_size=4, device="cpu", precision="fp32", dtype="float32"),
        in_place=True,
        sidecars=sidecars,
    )
    (failure,) = report.failures
    assert f"{svs}: level 0 tile {TILE} has changed since its sidecar" in failure["error"]
