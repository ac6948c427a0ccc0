"""Chunk integrity as properties: any damage to a sealed chunk is caught, arbitrary chunk bytes
read as pixels or as a ChunkError, arbitrary coordinate text parses or is an
AnnotationError. Nothing else escapes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import CMU
from tests.corpus import chunk_file, rewrite_chunk
from tilestore.errors import AnnotationError, ChunkError
from tilestore.format.integrity import Located, Location, read_file, seal, unseal
from tilestore.plan.annotations.base import number
from tilestore.plan.annotations.geojson import _check_geometry
from tilestore.reading.opening import open_slide

PROPS = settings(max_examples=200, deadline=None)


@PROPS
@given(st.binary(max_size=4096))
def test_a_sealed_chunk_unseals_to_itself(data):
    assert unseal(seal(data), "c") == data


@PROPS
@given(st.binary(min_size=1, max_size=2048), st.data())
def test_every_flipped_bit_and_every_cut_is_caught(data, draw):
    sealed = bytearray(seal(data))
    bit = draw.draw(st.integers(0, 8 * len(sealed) - 1))
    sealed[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ChunkError, match=r"^c: chunk is corrupt"):
        unseal(bytes(sealed), "c")
    cut = draw.draw(st.integers(0, len(sealed) - 1))
    with pytest.raises(ChunkError, match=r"^c: chunk is"):
        unseal(seal(data)[:cut], "c")


_LOCATION = st.builds(
    Location,
    st.sampled_from(["/s/c/0/0/0", "/s/c/0/0/1", "/slide.svs", "/é x/c"]),
    st.integers(0, 2**40),
    st.none() | st.integers(0, 2**31),
    st.none() | st.integers(0, 2**32 - 1),
    st.booleans(),
)


@given(st.lists(st.none() | _LOCATION, max_size=40), st.data())
def test_located_chunks_cross_a_pipe_as_they_were(locations, data):
    """Packed (`Located`: each file named once), sent as JSON and unpacked, any chunks'
    locations, absent ones too, are the ones packed; and so is any part of them, which
    names only its own files."""
    packed = Located.of(locations)
    assert len(packed.paths) == len({at.path for at in locations if at is not None})
    sent = Located(*json.loads(json.dumps(packed)))
    assert sent.unpacked() == locations
    start = data.draw(st.integers(0, len(locations)))
    stop = data.draw(st.integers(start, len(locations)))
    part = Located(*json.loads(json.dumps(packed.part(start, stop))))  # as a request sends it
    assert part.unpacked() == locations[start:stop]
    assert set(part.paths) == {at.path for at in locations[start:stop] if at is not None}


def test_reading_a_chunk_file_refuses_what_is_not_one(tmp_path):
    (tmp_path / "ok").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    (tmp_path / "dir").mkdir()
    assert read_file(tmp_path / "ok", "c", required=True) == b"abc"
    assert read_file(tmp_path / "gone", "c", required=False) is None
    for name, cause in [("gone", "missing"), ("link", "a symbolic link"), ("dir", "a folder")]:
        with pytest.raises(ChunkError, match=f"^c: chunk is {cause}"):
            read_file(tmp_path / name, "c", required=True)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, stores):
    """A private copy of the CMU store whose chunk (2, 3) the properties overwrite."""
    target = tmp_path_factory.mktemp("integrity") / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), target)
    return target


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=3000), st.booleans())
def test_any_chunk_bytes_read_as_pixels_or_as_a_chunk_error(scratch, data, sealed):
    """A chunk with a valid checksum over garbage (damaged before it was written) must still
    fail as a ChunkError naming it, from the JPEG decoder, not as the codec's own error."""
    rewrite_chunk(scratch, lambda _: seal(data) if sealed else data)  # chunk (2, 3)
    slide = open_slide(scratch)
    try:
        pixels = slide.read_region(720, 480, 240, 240, level=0)
    except ChunkError as exc:
        assert str(exc).startswith("cmu.ome.zarr: level 0 chunk (2, 3): ")
    else:
        assert sealed and pixels.shape == (240, 240, 3)


@PROPS
@given(st.text(max_size=12))
def test_coordinate_text_is_a_finite_number_or_an_annotation_error(text):
    try:
        value = number(Path("a.xml"), text, "X")
    except AnnotationError as exc:
        assert str(exc).startswith("a.xml: X is ")
    else:
        assert math.isfinite(value) and value == float(text)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)
GEOMETRY = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Point", "Polygon", "MultiPolygon", "LineString", "Other"]),
        "coordinates": JSON,
    }
)


@PROPS
@given(GEOMETRY | JSON)
@example({"type": []})  # an unhashable type name (found by this test in a later run)
def test_a_geometry_is_checked_or_refused_with_a_value_error(geometry):
    try:
        _check_geometry(geometry)
    except ValueError:
        return
    # accepted: every position is finite numbers, nested as its type says
    leaves = np.array(_leaves(geometry["coordinates"]), dtype=float)
    assert np.isfinite(leaves).all()
    json.dumps(geometry)


def _leaves(value):
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_the_trailer_is_four_bytes():
    # the byte, then its CRC-32C (0xa93c5f93 for b"x"), little-endian as zarr's crc32c codec
    assert seal(b"x") == b"x" + bytes.fromhex("935f3ca9")


DAMAGE = st.sampled_from(["garbage", "truncated", "empty", "missing", "link", "flipped bit"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(DAMAGE, st.integers(0, 2), st.data())
def test_any_damaged_chunk_read_lazily_is_a_chunk_error(tmp_path_factory, stores, how, level, draw):
    """The lazy views read as read_region does: a chunk damaged in any way (or gone, where
    the store was written whole) fails `to_dask` and `to_xarray` as a ChunkError naming it,
    never background and never zarr's raw checksum error."""
    store = tmp_path_factory.mktemp("lazy") / "cmu.ome.zarr"
    shutil.copytree(stores(CMU), store)
    reader = open_slide(store).chunks(level)
    row = draw.draw(st.integers(0, reader.grid[0] - 1))
    col = draw.draw(st.integers(0, reader.grid[1] - 1))
    where = f"cmu.ome.zarr: level {level} chunk ({row}, {col}): "
    if how == "link":  # the file holding it, its shard, a link to another level's
        shard = chunk_file(store, str(level), row, col)
        shard.unlink()
        shard.symlink_to(chunk_file(store, str((level + 1) % 3), 0, 0))
        where = f"cmu.ome.zarr: level {level} shard (0, {shard.parent.name}, {shard.name}): "
    else:

        def change(data: bytes) -> bytes | None:
            if how == "missing":
                return None
            cut = draw.draw(st.integers(0, len(data) - 1))
            damaged = bytearray(data)
            damaged[cut] ^= 1 << draw.draw(st.integers(0, 7))
            return {
                "garbage": bytes(len(data)),
                "truncated": data[:cut],
                "empty": b"",
                "flipped bit": bytes(damaged),
            }[how]

        rewrite_chunk(store, change, str(level), row, col)
    slide = open_slide(store)
    for lazy in (slide.to_dask(level), slide.to_xarray(level).data):
        with pytest.raises(ChunkError) as caught:
            lazy.compute()
        assert str(caught.value).startswith(where), str(caught.value)
    shutil.rmtree(store.parent)
