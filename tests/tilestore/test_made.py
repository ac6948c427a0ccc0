"""Many arrays made at once (`tilestore.format.made`): the same files as zarr's own
`create_array` makes one by one, and nothing written where one array's arguments fail."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.core.array import create_array
from zarr.storage import LocalStore, MemoryStore

from tilestore.format import made
from tilestore.format.codecs import zstd_codecs
from tilestore.format.made import made_new
from tilestore.format.shards import column, sharded


def _arrays(n: int) -> dict[str, dict]:
    rng = np.random.default_rng(n)
    return {
        "g/x": {"data": rng.integers(0, 10**6, n), **column(zstd_codecs(level=3), n)},
        "g/x_um": {
            "data": rng.random(n),
            "dimension_names": ("tile",),
            "attributes": {"units": "micrometre"},
            **column(zstd_codecs(level=3), n),
        },
        "g/features": {
            "shape": (n, 6),
            "dtype": "float32",
            "fill_value": np.nan,
            **sharded(zstd_codecs(level=1), (4, 6), (8, 6), True),
        },
        "g/crc32c/x": {
            "data": rng.integers(0, 2**32, 3).astype(np.uint64),
            "chunks": (3,),
            "overwrite": True,
            **zstd_codecs(),
        },
    }


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("n", [1, 45, 1000])
def test_the_arrays_are_the_files_zarr_makes_one_by_one(tmp_path, n):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for root in (ours, theirs):
        zarr.open_group(root, mode="w").require_group("g")
    store = LocalStore(ours)
    made = made_new(store, _arrays(n), ("g/crc32c",))

    async def one_by_one() -> None:
        for path, kwargs in _arrays(n).items():
            await create_array(LocalStore(theirs), name=path, **kwargs)

    asyncio.run(one_by_one())
    assert _files(ours) == _files(theirs)
    assert set(made) == set(_arrays(n))
    group = zarr.open_group(ours, mode="r")
    np.testing.assert_array_equal(group["g/x"][:], _arrays(n)["g/x"]["data"])
    assert np.isnan(group["g/features"][:]).all() and group["g/crc32c"].attrs == {}


def test_an_array_zarr_refuses_leaves_nothing_written(tmp_path):
    zarr.open_group(tmp_path, mode="w").require_group("g")
    before = _files(tmp_path)
    arrays = _arrays(45)
    arrays["g/bad"] = {"shape": (10,), "dtype": "float32", "chunks": (3,), "shards": (4,)}
    with pytest.raises(ValueError):
        made_new(LocalStore(tmp_path), arrays, ("g/crc32c",))
    assert _files(tmp_path) == before


class _Failing(MemoryStore):
    """A store reached through zarr (not a local folder) that fills at one key while its
    other writes are slow."""

    fails = ""

    async def set(self, key, value, byte_range=None):
        if key == self.fails:
            raise OSError(28, "No space left on device")
        await asyncio.sleep(0.2)
        return await super().set(key, value)


@pytest.mark.parametrize("fails", ["g/x_um/zarr.json", "g/crc32c/zarr.json", "g/x/c/0"])
def test_a_write_that_fails_leaves_none_running_once_it_is_raised(fails):
    """Through a store's own writes, concurrent, the error comes once every write has
    ended: what the caller then removes stays removed (zarr's `create_nodes` raises at the
    first and leaves the rest writing)."""
    import time

    store = _Failing()
    store.fails = fails
    with pytest.raises(OSError, match="No space left"):
        made_new(store, _arrays(45), ("g/crc32c",))
    written = set(store._store_dict)
    assert written and fails not in written
    time.sleep(0.5)
    assert set(store._store_dict) == written


def test_a_local_file_that_fails_raises_at_it_leaving_no_partial_file(tmp_path, monkeypatch):
    """A local store's files are written one after another, each whole: the disk filling
    at one raises there, and no temporary or partial file is left."""
    from tilestore.format import made, shards

    def full(path, data, write=shards.write_atomic):
        if path.name == "0" and path.parent.parent.name == "x_um":
            raise OSError(28, "No space left on device")
        write(path, data)

    zarr.open_group(tmp_path, mode="w").require_group("g")
    monkeypatch.setattr(made, "write_atomic", full)
    with pytest.raises(OSError, match="No space left"):
        made_new(LocalStore(tmp_path), _arrays(45), ("g/crc32c",))
    assert not [p for p in _files(tmp_path) if "partial" in p]
    assert "g/x_um/zarr.json" in _files(tmp_path) and "g/x_um/c/0" not in _files(tmp_path)


def test_a_read_only_store_is_refused_before_any_file(tmp_path):
    zarr.open_group(tmp_path, mode="w").require_group("g")
    before = _files(tmp_path)
    with pytest.raises(ValueError, match="read-only"):
        made_new(LocalStore(tmp_path, read_only=True), _arrays(45), ("g/crc32c",))
    assert _files(tmp_path) == before


def test_decisions_kept_serve_only_the_same_arguments(tmp_path, monkeypatch):
    """zarr's decisions are kept by their arguments (`DECISIONS`): groups made again and
    again are each the files zarr makes, and an array asked with any argument changed (its
    length, an attribute, its codec) is decided anew, never served another's metadata."""
    from tilestore.format import made

    monkeypatch.setattr(made, "DECISIONS", made.Kept(512))
    variants = {
        "same": lambda a: a,
        "length": lambda a: _arrays(46),
        "attribute": lambda a: {**a, "g/x_um": {**a["g/x_um"], "attributes": {"units": "nm"}}},
        "codec": lambda a: {**a, "g/x": {**a["g/x"], **column(zstd_codecs(level=5), 45)}},
    }
    for name, change in [("first", lambda a: a), *variants.items(), ("after", lambda a: a)]:
        ours, theirs = tmp_path / name / "ours", tmp_path / name / "theirs"
        for root in (ours, theirs):
            zarr.open_group(root, mode="w").require_group("g")
        arrays = change(_arrays(45))
        got = made.made_new(LocalStore(ours), arrays, ("g/crc32c",))
        if name == "same":  # an array's attributes changed in place (zarr does) change no other
            got["g/x_um"].attrs["units"] = "changed"
        elif name == "after":
            assert got["g/x_um"].attrs["units"] == "micrometre"
            assert got["g/x_um"].metadata.attributes == {"units": "micrometre"}

        async def one_by_one(arrays=arrays, theirs=theirs) -> None:
            for path, kwargs in arrays.items():
                await create_array(LocalStore(theirs), name=path, **kwargs)

        asyncio.run(one_by_one())
        if name != "same":
            assert _files(ours) == _files(theirs), name
    # the first's four; a new length: three (the crc32c record keeps its 3); one each after
    assert len(made.DECISIONS._kept) == 4 + 3 + 1 + 1


def test_kept_holds_the_last_ones_used():
    from tilestore.format.made import Kept

    kept = Kept(2)
    kept.put("a", 1)
    kept.put("b", 2)
    assert kept.get("a") == 1  # used: now the newest
    kept.put("c", 3)
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == (1, None, 3)


_KINDS = {  # dtype: values drawn, some the fill value, some NaN where it floats
    "float64": (np.nan, lambda rng, n: np.where(rng.random(n) < 0.3, np.nan, rng.random(n))),
    "float32": (0.0, lambda rng, n: np.where(rng.random(n) < 0.3, -0.0, rng.random(n))),
    "int64": (0, lambda rng, n: np.where(rng.random(n) < 0.5, 0, rng.integers(-9, 9, n))),
    "uint64": (2**64 - 1, lambda rng, n: rng.choice(np.array([2**64 - 1, 7], np.uint64), n)),
    "bool": (False, lambda rng, n: rng.random(n) < 0.1),
    ">i4": (0, lambda rng, n: rng.integers(-3, 3, n)),
}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(sorted(_KINDS)),
    n=st.integers(1, 300),
    chunk=st.integers(1, 64),
    per=st.integers(1, 5),
    layout=st.sampled_from(["column", "sharded", "plain", "plain-crc"]),
    empty=st.sampled_from(["none", "some", "all"]),
    write_empty=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_encoded_files_are_zarrs_own_bytes(
    tmp_path_factory, kind, n, chunk, per, layout, empty, write_empty, seed
):
    """Whatever the dtype (its byte order, NaN, -0.0), the length, the chunks and shards
    (partial last chunks and shards), chunks all the fill value (left out, or written where
    the config says so): the files `made_new` writes are byte for byte zarr's own."""
    rng = np.random.default_rng(seed)
    fill, draw = _KINDS[kind]
    data = np.asarray(draw(rng, n)).astype(kind)
    if empty == "all":
        data[:] = fill
    elif empty == "some":
        data[: min(n, chunk)] = fill
    codecs = zstd_codecs(level=3, checksums=layout != "plain")
    shapes = {
        "column": column(codecs, n, chunk),
        "sharded": sharded(codecs, (chunk,), (chunk * per,), True),
        "plain": {"chunks": (chunk,), **codecs},
        "plain-crc": {"chunks": (chunk,), **zstd_codecs(level=1)},
    }
    kwargs = {
        "data": data,
        "fill_value": fill,
        "config": {"write_empty_chunks": write_empty},
        **shapes[layout],
    }
    root = tmp_path_factory.mktemp("enc")
    made_new(LocalStore(root / "ours"), {"a": kwargs}, ())
    asyncio.run(create_array(LocalStore(root / "theirs"), name="a", **kwargs))
    assert _files(root / "ours") == _in_a(root / "theirs")
    got = zarr.open_array(root / "ours", path="a", mode="r")[:]
    np.testing.assert_array_equal(got, data)


def test_a_layout_not_encoded_here_is_written_by_zarr(tmp_path):
    """A 2-D sharded array with data (none of a group's, but asked) is zarr's to write:
    the same files as zarr's."""
    data = np.arange(60, dtype="float32").reshape(6, 10)
    kwargs = {"data": data, **sharded(zstd_codecs(level=1), (2, 5), (4, 10), True)}
    meta = made._decided(kwargs)[0]
    assert made.encoded(meta, data, made.parse_array_config(None)) is None  # zarr's to write
    made_new(LocalStore(tmp_path / "ours"), {"a": kwargs}, ())
    asyncio.run(create_array(LocalStore(tmp_path / "theirs"), name="a", **kwargs))
    assert _files(tmp_path / "ours") == _in_a(tmp_path / "theirs")


def _in_a(root: Path) -> dict[str, bytes]:
    """The files of the array "a" (zarr makes the root group's document too)."""
    return {k: v for k, v in _files(root).items() if k.startswith("a/")}
