"""Stores in a bucket read where they are, against a real S3 server (moto's, authentication
on): `status`, `verify` and `export` on a store's URL say what they say of its local copy,
its URL for its path (verify's verdict line for line, damaged copies too: a chunk's bytes,
a shard's index, a chunk moved, an object gone); a command that writes into a store refuses
its URL in one line, before any work, the bucket untouched; a URL is never folded into a
local path ("s3:/bucket/...")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CMU, SLIDES, no_secret, one_line_refusal, run_cli
from tests.s3 import BUCKET

STORE = "CMU-1-Small-Region.ome.zarr"
FEATURES = "embeddings/efficientnet-lite0/1mpp-224px/features"


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Path:
    """CMU embedded locally (a few tiles, efficientnet-lite0 on the CPU): its store."""
    here = tmp_path_factory.mktemp("here")
    embed = ("--model", "efficientnet-lite0", "--device", "cpu", "--mpp", "1", "--max-tiles", "8")
    done = run_cli("embed", SLIDES / CMU, "--into", here, *embed)
    assert done.returncode == 0, done.stdout + done.stderr
    return here / STORE


def _uploaded(s3, store: Path, prefix: str) -> str:
    """Every file of `store` as an object under `prefix`; the store's URL."""
    client = s3.client()
    for path in (p for p in store.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{STORE}/{path.relative_to(store)}")
    return f"s3://{BUCKET}/{prefix}/{STORE}"


def _keys(s3) -> list[tuple[str, str]]:
    listed = s3.client().list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return sorted((o["Key"], o["ETag"]) for o in listed)


def test_status_and_verify_on_a_stores_url_say_what_they_say_of_its_local_copy(
    s3, embedded, tmp_path
):
    url, env = _uploaded(s3, embedded, "same"), s3.env(tmp_path / "cache")
    there = run_cli("status", url, "--json", env=env)
    here = run_cli("status", embedded, "--json")
    assert there.returncode == here.returncode == 0, there.stderr
    remote, local = json.loads(there.stdout), json.loads(here.stdout)
    assert [r.pop("store") for r in remote["stores"]] == [url]
    for row in local["stores"]:
        row.pop("store")
    assert remote["stores"] == local["stores"] and remote["counts"]["complete"] == 1
    verified = run_cli("verify", url, env=env)
    assert verified.returncode == 0, verified.stderr
    line = verified.stdout.replace("\n", "")
    assert line.startswith(f"{url}: ") and "all good" in line
    counts = run_cli("verify", embedded).stdout.replace("\n", "").split(":")[1].split(" in ")[0]
    assert counts in line  # the same chunks of the same arrays read
    assert no_secret([s3.secret, s3.key], [there.stdout + there.stderr, line], [tmp_path]) >= 0


def _chunk_flipped(store: Path) -> str:
    """One byte of a chunk of level 0 changed (its CRC-32C then fails)."""
    shard = next(
        p for p in sorted((store / "0").rglob("*")) if p.is_file() and p.name != "zarr.json"
    )
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    return "chunk is corrupt"


def _index_cut(store: Path) -> str:
    """A features shard cut short: its index is gone."""
    shard = store / FEATURES / "c" / "0" / "0"
    shard.write_bytes(shard.read_bytes()[:-7])
    return "shard index"


def _columns_swapped(store: Path) -> str:
    """The x and y columns' objects swapped: each chunk sound, in another's place."""
    group = store / FEATURES.rpartition("/")[0]
    x, y = (group / "x" / "c" / "0").read_bytes(), (group / "y" / "c" / "0").read_bytes()
    (group / "x" / "c" / "0").write_bytes(y), (group / "y" / "c" / "0").write_bytes(x)
    return "not the one"


def _object_gone(store: Path) -> str:
    """A level's shard removed: every chunk of it missing where the store promises all."""
    shard = next(
        p for p in sorted((store / "1").rglob("*")) if p.is_file() and p.name != "zarr.json"
    )
    shard.unlink()
    return "missing"


@pytest.mark.parametrize("damage", [_chunk_flipped, _index_cut, _columns_swapped, _object_gone])
def test_verify_finds_in_a_bucket_every_fault_it_finds_in_the_local_copy(
    s3, embedded, tmp_path, monkeypatch, damage
):
    """The same damage, here and there: the same verdict, line for line, the URL for the
    path, each object fetched whole (one request a shard, its size from one listing of its
    array)."""
    _, url, here, there = _verified_here_and_there(
        s3, embedded, tmp_path, monkeypatch, damage, "damaged"
    )
    assert there.store == url
    assert (there.untied, there.untied_groups) == (here.untied, here.untied_groups)


def _verified_here_and_there(s3, embedded, tmp_path, monkeypatch, damage, prefix: str):
    """A damaged copy of `embedded` verified here and, uploaded, at its URL: (copy, url,
    here's verdict, there's), both checked to be the same line for line."""
    from tilestore.reading import verify_store

    copy = tmp_path / "copy" / STORE
    shutil.copytree(embedded, copy)
    said = damage(copy)
    url = _uploaded(s3, copy, f"{prefix}-{damage.__name__}")
    for name, value in s3.env(tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    here, there = verify_store(copy), verify_store(url)
    assert not here.ok and any(said in line for line in here.bad), here.bad
    assert (there.chunks, there.arrays) == (here.chunks, here.arrays)
    assert there.bad == [line.replace(str(copy), url) for line in here.bad]
    return copy, url, here, there


@pytest.mark.parametrize("damage", [_chunk_flipped, _index_cut, _object_gone])
def test_verify_reads_a_large_shard_by_ranges_with_the_local_copys_verdict(
    s3, embedded, tmp_path, monkeypatch, damage
):
    """A shard past `WHOLE_BYTES` is never fetched whole: its size from one listing of its
    array (never a request a shard), its index by its last bytes, then its chunks a few KB
    at a time (`RANGE_BYTES`), no byte of it twice; the verdict is the local copy's, line
    for line."""
    from tilestore.reading import verify as verifying
    from tilestore.sources.remote import UrlStore

    monkeypatch.setattr(verifying, "WHOLE_BYTES", 0)
    monkeypatch.setattr(verifying, "RANGE_BYTES", 4096)
    asked, get = [], UrlStore.get

    async def recorded(self, key, prototype, byte_range=None):
        found = await get(self, key, prototype, byte_range)
        asked.append((key, byte_range, None if found is None else len(found)))
        return found

    sized = []

    async def no_size(self, key):
        sized.append(key)
        return await UrlStore.__mro__[1].getsize(self, key)

    monkeypatch.setattr(UrlStore, "get", recorded)
    monkeypatch.setattr(UrlStore, "getsize", no_size)
    copy, *_ = _verified_here_and_there(s3, embedded, tmp_path, monkeypatch, damage, "ranged")
    level0 = sorted(p for p in (copy / "0").rglob("*") if p.is_file() and p.name != "zarr.json")
    for shard in level0:
        key = shard.relative_to(copy).as_posix()
        reads = [(r, n) for k, r, n in asked if k == key]
        assert reads and all(r is not None for r, _ in reads)  # never the whole object
        assert len(reads) > 2 and sum(n for _, n in reads) <= shard.stat().st_size
    assert all(not (copy / key).exists() for key in sized), sized  # only absent ones asked


@pytest.mark.parametrize(
    "command",
    [
        ("tissue",),
        ("plan", "--mpp", "1"),
        ("qc",),
        ("reshard",),
        ("classify", "--model", "conch_v1", "--prompts", "prompts.json"),
    ],
    ids=lambda c: c[0],
)
def test_a_command_that_writes_into_a_store_refuses_its_url_in_one_line(
    s3, embedded, tmp_path, command
):
    """Object storage's stores are read where they are, written only whole (`convert -o`):
    each command that changes a store says so, names the URL and what to do, before any
    work; nothing in the bucket changes, nothing is made here."""
    url = _uploaded(s3, embedded, "refused")
    before = _keys(s3)
    name, *flags = command
    done = run_cli(name, url, *flags, env=s3.env(tmp_path / "cache"), cwd=tmp_path)
    one_line_refusal(done, url, f"what tilestore {name} writes goes into", "aws s3 sync")
    assert _keys(s3) == before
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_url_is_never_read_as_a_local_path(s3, tmp_path):
    """A store's URL that is not there is said to be not there by its URL, never as
    "s3:/bucket/..." (a Path folds its //): the command's line names what was given."""
    url = f"s3://{BUCKET}/nowhere/{STORE}"
    for command in ("status", "verify"):
        done = run_cli(command, url, env=s3.env(tmp_path / "cache"))
        assert done.returncode == 2 and url in done.stderr, done.stderr
        assert "s3:/" + BUCKET not in done.stderr.replace(url, ""), done.stderr


def test_export_reads_a_store_in_a_bucket_as_its_local_copy(s3, embedded, tmp_path):
    """An export of a store's URL (TRIDENT's HDF5): the local copy's features, bit for bit."""
    import h5py

    url, env = _uploaded(s3, embedded, "export"), s3.env(tmp_path / "cache")
    model = ("--model", "efficientnet-lite0")
    there = run_cli("export", "h5", url, *model, "-o", tmp_path / "there", env=env)
    here = run_cli("export", "h5", embedded, *model, "-o", tmp_path / "here")
    assert there.returncode == here.returncode == 0, there.stdout + there.stderr
    (a,), (b,) = sorted((tmp_path / "there").glob("*.h5")), sorted((tmp_path / "here").glob("*.h5"))
    with h5py.File(a) as fa, h5py.File(b) as fb:
        assert sorted(fa) == sorted(fb)
        assert fa["coords"].attrs["tilestore_store"] == url  # the URL, never "<cwd>/s3:/..."
        assert fb["coords"].attrs["tilestore_store"] == str(embedded.resolve())
        for key in fa:
            np.testing.assert_array_equal(fa[key][()], fb[key][()])


def test_view_serves_a_store_in_a_bucket_as_its_local_copy(s3, embedded, tmp_path):
    """`tilestore view URL`: the slide listed by its name, with its embeddings; a tile the
    local copy's, byte for byte (JPEG as stored)."""
    from tests.cli.test_view_cli import get, running

    url = _uploaded(s3, embedded, "view")
    with running(url, env=s3.env(tmp_path / "cache")) as (there, _):
        listed = json.loads(get(there + "api/slides")[1])
        tile = get(there + "tiles/0/0/0/0")[1]
    with running(embedded) as (here, _):
        local = json.loads(get(here + "api/slides")[1])
        assert tile == get(here + "tiles/0/0/0/0")[1] and tile[:2] == b"\xff\xd8"
    assert (
        json.dumps(listed).count("efficientnet-lite0")
        == json.dumps(local).count("efficientnet-lite0")
        > 0
    )


def test_the_library_never_writes_a_piece_of_a_store_in_a_bucket(
    s3, embedded, tmp_path, monkeypatch
):
    """Behind the commands' door, the library's own: a slide opened by URL gives no group to
    write (a tissue mask, a plan, a label: `Slide.writable_group`), one line naming it; the
    bucket untouched."""
    import tilestore
    from tilestore.errors import StoreError
    from tilestore.masks import compute_tissue, write_tissue
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan

    url = _uploaded(s3, embedded, "library")
    for name, value in s3.env(tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    slide = tilestore.open_slide(url)
    before = _keys(s3)
    with pytest.raises(StoreError, match="only read where it is: copy it here") as caught:
        write_tissue(slide, compute_tissue(slide))
    assert "\n" not in str(caught.value) and url in str(caught.value)
    with pytest.raises(StoreError, match="plan or embeddings group goes into the store"):
        save_plan(slide, plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=112, min_tissue=0)))
    assert _keys(s3) == before


@pytest.fixture
def served(embedded):
    """The embedded store's folder served by Python's own web server, which answers every
    byte range with the whole file (it ignores Range); its URL."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = str(embedded.parent)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            folder,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/{STORE}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/zarr.json", timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield url
    server.terminate()
    server.wait(10)


def test_a_server_that_ignores_byte_ranges_is_said_so_never_taken_for_damage(served, tmp_path):
    """A byte range answered with the whole file would give a chunk's position the file's
    last 4 bytes: `status` would call a sound store damaged. It says the server ignores
    ranges, in one line, exit 2; `verify`, which fetches each object whole, finds it sound."""
    done = run_cli("status", served)
    one_line_refusal(done, served, "ignores Range requests")
    assert "damaged" not in done.stdout + done.stderr
    verified = run_cli("verify", served)
    assert verified.returncode == 0 and "all good" in verified.stdout, verified.stderr


def test_a_server_that_does_not_answer_is_one_line_for_every_reader(embedded, tmp_path):
    """No S3 server at the endpoint: `status`, `verify` and `info` say the server did not
    answer, one line, exit 2 (never "internal error", never "damaged")."""
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "not-a-real-secret",
        "AWS_MAX_ATTEMPTS": "1",
        "TILESTORE_CACHE": str(tmp_path / "cache"),
    }
    url = f"s3://{BUCKET}/gone/{STORE}"
    for command in ("status", "verify", "info"):
        done = run_cli(command, url, env={**__import__("os").environ, **env})
        one_line_refusal(done, url, "the server did not answer")
        assert "not-a-real-secret" not in done.stdout + done.stderr


def test_no_user_password_or_query_of_a_stores_url_is_ever_said(served, tmp_path):
    """A store's URL with a user, a password and a signature: every line of `status`,
    `verify` and `info` names it without them, whatever the server says."""
    host = served.split("//")[1]
    url = f"http://alice:hunter2@{host}?sig=SECRETSIG"
    for command in ("status", "verify", "info"):
        done = run_cli(command, url)
        said = done.stdout + done.stderr
        assert "hunter2" not in said and "SECRETSIG" not in said and "alice" not in said, said


def test_status_of_a_store_in_a_bucket_with_work_left_says_to_copy_it_not_a_command(
    s3, embedded, tmp_path
):
    """Embedding writes into a store: for a store in a bucket with work left, `status`
    prints no `tilestore embed` command that could not run, but how to do it."""
    url, env = _uploaded(s3, embedded, "left"), s3.env(tmp_path / "cache")
    done = run_cli("status", url, "--model", "uni", env=env)
    assert done.returncode == 1, done.stderr
    assert "tilestore embed" not in done.stdout
    assert "1 store left in object storage" in done.stdout and "aws s3 sync" in done.stdout
    listed = json.loads(run_cli("status", url, "--model", "uni", "--json", env=env).stdout)
    assert listed["in_object_storage"] == [url] and listed["commands"] == []
    # beside a local store with work left: its command and --todo line, not the URL's
    todo = tmp_path / "left.txt"
    both = run_cli("status", embedded, url, "--model", "uni", "--todo", todo, env=env)
    assert both.returncode == 1, both.stderr
    assert todo.read_text() == f"{embedded}\n"
    (command,) = [line for line in both.stdout.splitlines() if "tilestore embed" in line]
    assert url not in command and "1 store left in object storage" in both.stdout
