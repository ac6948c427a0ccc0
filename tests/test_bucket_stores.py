"""Stores converted into a bucket (`convert -o s3://bucket/prefix`), against a real S3 server
(moto's, authentication on): built in the cache, then uploaded, the root document last; the
objects are the local store's files, byte for byte; read back by tilestore and by plain zarr;
a store there is replaced only when asked, its stale objects removed; a cut upload leaves
nothing that opens, and the next run completes it; refusals in one line, before any work."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.conftest import CMU, KIDNEY, SLIDES, no_secret, one_line_refusal, run_cli, store_tree
from tests.s3 import BUCKET, Proxy
from tilestore.conversion.bucket import MARK, ROOT
from tilestore.errors import OutputError, StoreError

STORE = "CMU-1-Small-Region.ome.zarr"


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    """CMU and KIDNEY converted into a local folder, as a user converts them."""
    out = tmp_path_factory.mktemp("local")
    done = run_cli("convert", SLIDES / CMU, SLIDES / KIDNEY, "--mpp", "0.5", "-o", out)
    assert done.returncode == 0, done.stderr
    return out


def _keys(s3, prefix: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def _downloaded(s3, prefix: str, folder: Path) -> Path:
    """Every object under `prefix`, as files under `folder` (a store as a tree)."""
    client = s3.client()
    for key in _keys(s3, prefix):
        path = folder / key[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    return folder


def _env(s3, tmp_path: Path) -> dict[str, str]:
    return s3.env(tmp_path / "cache")


def _said(done) -> str:
    return done.stdout + done.stderr


@pytest.mark.parametrize("at_once", [1, 2])
def test_stores_converted_into_a_bucket_are_the_local_stores_object_for_object(
    s3, local, tmp_path, at_once
):
    prefix = f"cohort-{at_once}/"
    url = f"s3://{BUCKET}/{prefix}"
    args = ("--mpp", "0.5", "--at-once", str(at_once))
    done = run_cli(
        "convert", SLIDES / CMU, SLIDES / KIDNEY, *args, "-o", url, env=_env(s3, tmp_path)
    )
    assert done.returncode == 0, _said(done)
    assert f"{url}{STORE}" in done.stdout  # the store named by its URL
    for store in (STORE, "kidney-48-5.ome.zarr"):
        there = _downloaded(s3, f"{prefix}{store}/", tmp_path / "there" / store)
        assert store_tree(there) == store_tree(local / store)  # every object, bit for bit
        assert f"{prefix}{store}/{MARK}" not in _keys(s3, prefix)  # its mark gone
    # nothing left in the cache of the copies built there
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
    assert no_secret([s3.secret, s3.key], [_said(done)], [tmp_path]) > 10


def test_a_store_in_a_bucket_reads_as_its_local_store_through_tilestore_and_plain_zarr(
    s3, local, tmp_path, monkeypatch
):
    import tilestore
    from tilestore.sources.remote import storage_options

    url = f"s3://{BUCKET}/read/{STORE}"
    done = run_cli("convert", SLIDES / CMU, "-o", url, env=_env(s3, tmp_path))
    assert done.returncode == 0, _said(done)
    for name, value in _env(s3, tmp_path).items():
        monkeypatch.setenv(name, value)
    there, here = tilestore.open_slide(url), tilestore.open_slide(local / STORE)
    for level in range(len(here.levels)):
        assert np.array_equal(
            there.read_region(0, 0, 700, 500, level=level),
            here.read_region(0, 0, 700, 500, level=level),
        )
    store = zarr.storage.FsspecStore.from_url(
        url, read_only=True, storage_options=storage_options(url)
    )
    plain = zarr.open_group(store, mode="r")  # zarr alone: no tilestore in the way
    assert np.array_equal(plain["0"][:], zarr.open_group(local / STORE, mode="r")["0"][:])


def test_a_slide_in_a_bucket_converted_into_a_bucket(s3, local, tmp_path):
    """Both ends remote: the slide staged, the store uploaded; the local file's store (the
    source's time aside: a staged file carries its object's)."""
    s3.put(f"slides-in/{CMU}", (SLIDES / CMU).read_bytes())
    done = run_cli(
        "convert", f"s3://{BUCKET}/slides-in/{CMU}", "-o", f"s3://{BUCKET}/both/",
        env=_env(s3, tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, _said(done)
    there = _downloaded(s3, f"both/{STORE}/", tmp_path / "there")
    assert store_tree(there, source_time=False) == store_tree(local / STORE, source_time=False)


def test_info_describes_a_store_in_a_bucket_as_its_local_store(s3, tmp_path):
    """`tilestore info` on a store's URL (its embeddings' status too): what the local store
    says, every field but its path; read where it is, nothing staged."""
    import json

    here = tmp_path / "here"
    embed = ("--model", "efficientnet-lite0", "--device", "cpu", "--mpp", "1", "--max-tiles", "8")
    done = run_cli("embed", SLIDES / CMU, "--into", here, *embed)
    assert done.returncode == 0, _said(done)
    client = s3.client()
    for path in (p for p in (here / STORE).rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"info/{STORE}/{path.relative_to(here / STORE)}")
    url, env = f"s3://{BUCKET}/info/{STORE}", _env(s3, tmp_path)
    there = run_cli("info", url, "--json", env=env)
    assert there.returncode == 0, _said(there)
    local = json.loads(run_cli("info", here / STORE, "--json").stdout)
    remote = json.loads(there.stdout)
    assert remote.pop("path") == url and local.pop("path") == str(here / STORE)
    for group in (*remote["embeddings"], *local["embeddings"]):
        assert group["state"] == "complete"
    assert remote == local
    assert not (tmp_path / "cache").exists()  # nothing staged


def test_a_store_there_is_replaced_only_when_asked_and_its_stale_objects_go(s3, local, tmp_path):
    env, url = _env(s3, tmp_path), f"s3://{BUCKET}/replaced/"
    assert run_cli("convert", SLIDES / CMU, "-o", url, env=env).returncode == 0
    stale = f"replaced/{STORE}/3/zarr.json"  # a level the old store had, the new one lacks
    s3.put(stale, b'{"zarr_format": 3, "node_type": "group"}')
    before = _keys(s3, "replaced/")
    again = run_cli("convert", SLIDES / CMU, "-o", url, env=env)
    one_line_refusal(again, f"{url}{STORE}", "already exists", "--overwrite")
    assert _keys(s3, "replaced/") == before  # nothing put, nothing removed
    done = run_cli("convert", SLIDES / CMU, "-o", url, "--overwrite", env=env)
    assert done.returncode == 0, _said(done)
    assert stale not in _keys(s3, "replaced/")
    there = _downloaded(s3, f"replaced/{STORE}/", tmp_path / "there")
    assert store_tree(there) == store_tree(local / STORE)


def test_a_cut_upload_leaves_nothing_that_opens_and_the_next_run_completes_it(
    s3, local, tmp_path, monkeypatch
):
    import s3fs

    import tilestore

    for name, value in _env(s3, tmp_path).items():
        monkeypatch.setenv(name, value)
    url, prefix = f"s3://{BUCKET}/cut/{STORE}", f"cut/{STORE}/"
    put, started, done, cutting = s3fs.S3FileSystem._put_file, [], [], [True]

    async def cut(self, lpath, rpath, **kwargs):  # the link lost once 4 objects are put
        started.append(rpath)
        if cutting[0] and len(started) > 4:
            while len(done) < 4:
                await asyncio.sleep(0.01)
            raise ConnectionError("the server went away")
        await put(self, lpath, rpath, **kwargs)
        done.append(rpath)

    # (a filesystem made meanwhile keeps its methods bound: the link mends, the patch stays)
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", cut)
    with pytest.raises(StoreError, match=re.escape(url) + ".*cannot upload the store"):
        tilestore.convert(SLIDES / CMU, url)
    cutting[0] = False
    keys = _keys(s3, prefix)
    assert f"{prefix}{MARK}" in keys and f"{prefix}{ROOT}" not in keys
    assert set(done) < {f"{BUCKET}/{key}" for key in keys}  # what was put stays, but
    assert f"{prefix}{ROOT}" not in keys  # never the root document
    with pytest.raises(StoreError):
        tilestore.open_slide(url)
    with pytest.raises(FileNotFoundError):  # nor does zarr alone take it for a store
        zarr.open_group(f"{url}", mode="r", storage_options={"endpoint_url": s3.endpoint})
    report = tilestore.convert(SLIDES / CMU, url)  # no overwrite: the cut upload is ours
    assert report.store == url
    there = _downloaded(s3, prefix, tmp_path / "there")
    assert store_tree(there) == store_tree(local / STORE)


def test_the_server_stopped_mid_upload_is_one_line_and_the_next_run_completes(s3, local, tmp_path):
    """The server gone after 1 MB of the store's 2.5 MB went up (every connection ended,
    new ones refused): one line naming the store, exit 2; its objects put so far beside the
    mark, no root document; the server back, the same command completes the store."""
    url, prefix = f"s3://{BUCKET}/stopped/", f"stopped/{STORE}/"
    with Proxy(s3.port, gone_after=2**20) as proxy:
        env = s3.env(tmp_path / "cache", AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
        done = run_cli("convert", SLIDES / CMU, "-o", url, env=env)
        one_line_refusal(done, f"{url}{STORE}", "cannot upload the store", "did not answer")
        keys = _keys(s3, prefix)
        assert f"{prefix}{MARK}" in keys and f"{prefix}{ROOT}" not in keys
        proxy.mend()
        again = run_cli("convert", SLIDES / CMU, "-o", url, env=env)
        assert again.returncode == 0, _said(again)
    there = _downloaded(s3, prefix, tmp_path / "there")
    assert store_tree(there) == store_tree(local / STORE)
    assert s3.secret not in _said(done) + _said(again)


def test_a_throttling_server_is_retried_and_the_upload_completes(s3, local, tmp_path):
    """503 SlowDown on the first requests (as S3 throttles): retried (AWS_MAX_ATTEMPTS),
    and the store is put whole."""
    with Proxy(s3.port, throttle=1) as proxy:
        env = s3.env(tmp_path / "cache", AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
        done = run_cli("convert", SLIDES / CMU, "-o", f"s3://{BUCKET}/throttled/", env=env)
        assert done.returncode == 0, _said(done)
        assert proxy.throttled == 1
    there = _downloaded(s3, f"throttled/{STORE}/", tmp_path / "there")
    assert store_tree(there) == store_tree(local / STORE)


def test_objects_that_are_not_a_store_are_never_replaced(s3, tmp_path):
    env, mine = _env(s3, tmp_path), f"theirs/{STORE}/notes.txt"
    s3.put(mine, b"the user's own")
    for extra in ((), ("--overwrite",)):
        done = run_cli("convert", SLIDES / CMU, "-o", f"s3://{BUCKET}/theirs/", *extra, env=env)
        one_line_refusal(done, f"s3://{BUCKET}/theirs/{STORE}", "not a tilestore store")
    assert _keys(s3, "theirs/") == [mine]  # no mark left beside them, nothing removed


@pytest.mark.parametrize("case", ["wrong secret", "no bucket", "writes refused"])
def test_a_place_that_cannot_take_the_store_is_said_before_the_slide_is_fetched(s3, tmp_path, case):
    """One line naming the store's URL and the cause, exit 2, before the slide (in a bucket
    too) is staged: nothing fetched, nothing put, no secret said."""
    s3.put(f"door/{CMU}", (SLIDES / CMU).read_bytes())
    changed, bucket, why = {
        "wrong secret": ({"AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}, BUCKET, "(403)"),
        "no bucket": ({}, "no-such-bucket", "not found (404)"),
        "writes refused": (s3.read_only, BUCKET, "access refused (403)"),
    }[case]
    url = f"s3://{bucket}/refused/"
    cache = tmp_path / "c"
    done = run_cli("convert", f"s3://{BUCKET}/door/{CMU}", "-o", url, env=s3.env(cache, **changed))
    if case == "wrong secret":  # the slide's own door says it first: the same credential
        one_line_refusal(done, why)
    else:
        one_line_refusal(done, f"s3://{bucket}/refused/{STORE}", why)
    assert not [p for p in cache.rglob("*") if p.is_file()]  # nothing staged
    assert _keys(s3, "refused/") == []  # nothing put (nor a mark)
    secrets = [s3.secret, "wrong-secret-value", s3.read_only["AWS_SECRET_ACCESS_KEY"]]
    assert not any(secret in _said(done) for secret in secrets)


def test_a_live_mark_is_refused_and_a_gone_ones_place_taken_over(s3, local, tmp_path):
    """Another run converting into the place (this host's process alive, its mark beating):
    one line naming it, nothing put; its process gone: the place taken over, the store
    complete."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time

    prefix = f"marked/{STORE}/"
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    mark = {"host": socket.gethostname(), "since": now, "beat": now, "token": "t"}
    s3.put(f"{prefix}{MARK}", json.dumps({**mark, "pid": os.getpid()}).encode())
    s3.put(f"{prefix}0/zarr.json", b"{}")  # that run's first objects
    env = _env(s3, tmp_path)
    done = run_cli("convert", SLIDES / CMU, "-o", f"s3://{BUCKET}/marked/", env=env)
    one_line_refusal(done, f"s3://{BUCKET}/{prefix}", f"being converted into by pid {os.getpid()}")
    assert set(_keys(s3, prefix)) == {f"{prefix}0/zarr.json", f"{prefix}{MARK}"}
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    s3.put(f"{prefix}{MARK}", json.dumps({**mark, "pid": int(ended.stdout)}).encode())
    done = run_cli("convert", SLIDES / CMU, "-o", f"s3://{BUCKET}/marked/", env=env)
    assert done.returncode == 0, _said(done)
    there = _downloaded(s3, prefix, tmp_path / "there")
    assert store_tree(there) == store_tree(local / STORE)


def test_two_conversions_at_once_into_one_place_leave_one_store_whole(s3, local, tmp_path):
    """Two commands converting into one URL at the same time (each its own cache, as two
    hosts): whichever runs, the other is refused in one line (the place is being converted
    into, or the other's mark replaced its own) or finds the store made; never both writing,
    and the store there is the local one, object for object, with no mark left."""
    import subprocess
    import sys

    url = f"s3://{BUCKET}/twice/"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "tilestore.cli", "convert", str(SLIDES / CMU), "-o", url],
            env=s3.env(tmp_path / f"cache{i}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    said = [(run.wait(300), *run.communicate()) for run in runs]
    assert sorted(code for code, _, _ in said)[0] == 0, said  # one made it
    for code, _, err in said:
        if code:
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            why = ("being converted into", "converts into it too", "already exists", "another run")
            assert any(w in err for w in why), err
    there = _downloaded(s3, f"twice/{STORE}/", tmp_path / "there")
    assert store_tree(there) == store_tree(local / STORE)
    assert f"twice/{STORE}/{MARK}" not in _keys(s3, "twice/")


def test_a_conversion_failing_before_its_upload_leaves_the_store_there_as_it_was(
    s3, local, tmp_path
):
    """--overwrite over a store, the slide damaged: one line, exit 2; the store there still
    the one it was, object for object, and no mark left in it."""
    env, url, prefix = _env(s3, tmp_path), f"s3://{BUCKET}/kept/", f"kept/{STORE}/"
    assert run_cli("convert", SLIDES / CMU, "-o", url, env=env).returncode == 0
    before = {k: s3.client().get_object(Bucket=BUCKET, Key=k)["Body"].read()
              for k in _keys(s3, prefix)}  # fmt: skip
    damaged = tmp_path / CMU
    damaged.write_bytes((SLIDES / CMU).read_bytes()[:4096])
    done = run_cli("convert", damaged, "-o", url, "--overwrite", env=env)
    one_line_refusal(done, CMU)
    after = {k: s3.client().get_object(Bucket=BUCKET, Key=k)["Body"].read()
             for k in _keys(s3, prefix)}  # fmt: skip
    assert after == before and f"{prefix}{MARK}" not in after


def test_overwrite_touches_only_the_store_never_its_neighbours(s3, tmp_path):
    env, url = _env(s3, tmp_path), f"s3://{BUCKET}/near/"
    assert run_cli("convert", SLIDES / CMU, "-o", url, env=env).returncode == 0
    neighbours = [f"near/{STORE}.bak/zarr.json", f"near/{STORE}x", f"near/{STORE[:-5]}/c"]
    for key in neighbours:
        s3.put(key, b"the user's")
    done = run_cli("convert", SLIDES / CMU, "-o", url, "--overwrite", env=env)
    assert done.returncode == 0, _said(done)
    assert set(neighbours) <= set(_keys(s3, "near/"))


@pytest.mark.parametrize(
    ("output", "why"),
    [
        ("s3://user:pw@slides/x/", "names no user, password, query or fragment"),
        ("s3://slides/x?versionId=3", "names no user, password, query or fragment"),
        ("s3://slides//x/", "no empty, . or .. step"),
        ("memory://x/", "memory:// is not an object store tilestore writes"),
    ],
)
def test_a_url_that_is_no_place_for_a_store_is_refused_in_one_line(output, why, tmp_path):
    import os

    done = run_cli(
        "convert", SLIDES / CMU, "-o", output, env={**os.environ, "TILESTORE_CACHE": str(tmp_path)}
    )
    one_line_refusal(done, why)
    assert "pw" not in done.stderr
    assert not any(tmp_path.iterdir())


def test_outputs_a_bucket_cannot_be_are_refused_in_one_line(s3, tmp_path):
    import tilestore

    https = run_cli("convert", SLIDES / CMU, "-o", "https://example.org/stores/")
    one_line_refusal(https, "--output https://example.org/stores/", "read, never written")
    sidecar = run_cli(
        "convert", SLIDES / CMU, "--in-place", "-o", f"s3://{BUCKET}/x/", env=_env(s3, tmp_path)
    )
    one_line_refusal(sidecar, f"--output s3://{BUCKET}/x/", "sidecars", "local folder")
    with pytest.raises(
        OutputError, match=re.escape("dst https://example.org/x: https:// URLs are read, never")
    ):
        tilestore.convert(SLIDES / CMU, "https://example.org/x")
    assert _keys(s3, "x/") == []


def test_only_killed_runs_copies_are_cleared_from_the_cache(tmp_path):
    """A copy being built by a live process (this host's, or another host's of a shared
    cache) is never removed; a killed process's copy on this host is."""
    import os
    import socket
    import subprocess
    import sys

    from tilestore.conversion.bucket import _clear_stale_copies

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()
    copies = {
        "killed": f"{host}.{int(ended.stdout)}.aaaa",
        "live": f"{host}.{os.getpid()}.bbbb",
        "elsewhere": "node-17.cluster.org.4242.cccc",
    }
    for name in copies.values():
        (tmp_path / name / STORE).mkdir(parents=True)
    _clear_stale_copies(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [copies["live"], copies["elsewhere"]]
    )
