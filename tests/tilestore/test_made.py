"""Many arrays made at once (`tilestore.format.made`): the same files as zarr's own
`create_array` makes one by one, and nothing written where one array's arguments fail."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.core.array import create_array
from zarr.storage import LocalStore

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
    made = asyncio.run(made_new(store, _arrays(n), ("g/crc32c",)))

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
        asyncio.run(made_new(LocalStore(tmp_path), arrays, ("g/crc32c",)))
    assert _files(tmp_path) == before


class _Failing(LocalStore):
    """A disk that fills at one file while the others are slow to write."""

    fails = ""

    async def set(self, key, value, byte_range=None):
        if key == self.fails:
            raise OSError(28, "No space left on device")
        await asyncio.sleep(0.2)
        return await super().set(key, value)


@pytest.mark.parametrize("fails", ["g/x_um/zarr.json", "g/crc32c/zarr.json", "g/x/c/0"])
def test_a_write_that_fails_leaves_none_running_once_it_is_raised(tmp_path, fails):
    """The error comes once every write of its round has ended: the group removed then stays
    removed (zarr's `create_nodes` raises at the first and leaves the rest writing)."""
    import shutil
    import time

    zarr.open_group(tmp_path, mode="w").require_group("g")
    store = _Failing(tmp_path)
    store.fails = fails
    with pytest.raises(OSError, match="No space left"):
        asyncio.run(made_new(store, _arrays(45), ("g/crc32c",)))
    shutil.rmtree(tmp_path / "g")
    time.sleep(0.5)
    assert not (tmp_path / "g").exists()


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
        got = asyncio.run(made.made_new(LocalStore(ours), arrays, ("g/crc32c",)))
        if name == "same":  # an array's attributes changed in place (zarr does) change no other
            zarr.Array(got["g/x_um"]).attrs["units"] = "changed"

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
