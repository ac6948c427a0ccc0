"""Slides named by URL, against a real S3 server (moto's, with authentication on): staged
whole to the cache and converted into the store their local file makes; refused at the door
in one line where they cannot be read; a transfer cut leaves nothing that reads as a slide;
no secret in any output."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.conftest import (
    CMU,
    IHC,
    SLIDES,
    group_of,
    no_secret,
    one_line_refusal,
    run_cli,
    store_tree,
)
from tests.s3 import Proxy, start_s3
from tilestore.errors import OptionError, SlideError
from tilestore.sources import remote
from tilestore.sources.remote import Remote, is_url, shown


@pytest.fixture(scope="module")
def s3():
    server = start_s3()
    server.put(f"cohort/{CMU}", (SLIDES / CMU).read_bytes())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local")
    done = run_cli("convert", SLIDES / CMU, "-o", out)
    assert done.returncode == 0, done.stderr
    return out / "CMU-1-Small-Region.ome.zarr"


def _tree(store: Path) -> dict[str, str]:
    """Every file, the root record whole but for the source's time (a staged file's is
    the object's, not the local file's)."""
    meta = json.loads((store / "zarr.json").read_text())
    assert meta["attributes"]["tilestore"]["source"]["mtime_ns"] > 0
    return store_tree(store, source_time=False)


def _said(done) -> str:
    return done.stdout + done.stderr


def test_a_slide_from_s3_makes_the_store_its_local_file_makes(s3, local_store, tmp_path):
    url = f"s3://slides/cohort/{CMU}"
    cache = tmp_path / "cache"
    done = run_cli("convert", url, "-o", tmp_path / "out", env=s3.env(cache))
    assert done.returncode == 0, _said(done)
    store = tmp_path / "out" / "CMU-1-Small-Region.ome.zarr"
    assert _tree(store) == _tree(local_store)  # every chunk and array, bit for bit
    staged = cache / "slides" / "s3" / "slides" / "cohort" / CMU
    assert staged.read_bytes() == (SLIDES / CMU).read_bytes()
    said = json.loads(staged.with_name(CMU + ".staged.json").read_text())
    assert said["url"] == url and said["size"] == staged.stat().st_size
    # the store records the object's time, not the download's
    head = s3.client().head_object(Bucket="slides", Key=f"cohort/{CMU}")
    meta = json.loads((store / "zarr.json").read_text())["attributes"]["tilestore"]
    assert meta["source"]["mtime_ns"] // 10**9 == int(head["LastModified"].timestamp())
    # again: the staged copy is used as it is (the same file, not fetched again)
    inode = staged.stat().st_ino
    again = run_cli("convert", url, "-o", tmp_path / "again", env=s3.env(cache))
    assert again.returncode == 0, _said(again)
    assert staged.stat().st_ino == inode
    assert _tree(tmp_path / "again" / "CMU-1-Small-Region.ome.zarr") == _tree(local_store)
    for output in (_said(done), _said(again), *(p.read_text() for p in cache.rglob("*.json"))):
        assert s3.secret not in output and s3.key not in output


def test_a_slide_changed_in_the_bucket_is_fetched_again(s3, tmp_path):
    data = (SLIDES / CMU).read_bytes()
    url = s3.put("changing/slide.svs", data[: len(data) // 2])
    env = s3.env(tmp_path / "cache")
    first = run_cli("convert", url, "-o", tmp_path / "a", env=env)
    assert first.returncode == 2  # half a slide: refused, naming the URL, not the cache
    one_line_refusal(first, url)
    assert str(tmp_path / "cache") not in first.stderr
    s3.put("changing/slide.svs", data)
    second = run_cli("convert", url, "-o", tmp_path / "b", env=env)
    assert second.returncode == 0, _said(second)
    staged = tmp_path / "cache" / "slides" / "s3" / "slides" / "changing" / "slide.svs"
    assert staged.read_bytes() == data


@pytest.mark.parametrize(
    "url, why",
    [
        ("s3://slides/cohort/missing.svs", "not found (404)"),
        ("s3://no-such-bucket/slide.svs", "not found (404)"),
    ],
)
def test_a_url_that_cannot_be_read_is_refused_at_the_door(s3, tmp_path, url, why):
    """One line naming the URL and the cause, exit 2, before the other slide is converted."""
    out = tmp_path / "out"
    done = run_cli("convert", SLIDES / CMU, url, "-o", out, env=s3.env(tmp_path / "c"))
    one_line_refusal(done, url, why)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("changed", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
def test_a_wrong_credential_is_said_in_one_line_without_the_secret(s3, tmp_path, changed):
    wrong = "wrong-" + s3.secret[::-1]
    env = s3.env(tmp_path / "c", **{changed: wrong})
    done = run_cli("convert", f"s3://slides/cohort/{CMU}", "-o", tmp_path / "o", env=env)
    one_line_refusal(done, f"s3://slides/cohort/{CMU}", "access refused (403)")
    for secret in (wrong, s3.secret, s3.key):
        assert secret not in _said(done)


def _without_credentials(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        del env[name]
    none = str(tmp_path / "none")  # no profile either, nor an instance's role
    env.update(AWS_SHARED_CREDENTIALS_FILE=none, AWS_CONFIG_FILE=none)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def test_no_credentials_at_all_is_said_inone_line_refusal(s3, tmp_path):
    env = _without_credentials(s3.env(tmp_path / "c"), tmp_path)
    done = run_cli("convert", f"s3://slides/cohort/{CMU}", "-o", tmp_path / "o", env=env)
    one_line_refusal(
        done, f"s3://slides/cohort/{CMU}", "no credentials found", "AWS_NO_SIGN_REQUEST=YES"
    )


def test_a_public_bucket_is_read_unsigned_only_where_asked(s3, local_store, tmp_path):
    """AWS_NO_SIGN_REQUEST=YES (as GDAL and the AWS CLI's --no-sign-request): a public
    bucket's slide is converted with no credential at all, into the store its local file
    makes; without it, no credentials is one line naming the variable; with it, the
    credentials the environment holds are not sent (the private server refuses: 403)."""
    public = start_s3(auth=False)  # a public object, read unsigned (moto: without auth only)
    try:
        url = public.put(f"open/{CMU}", (SLIDES / CMU).read_bytes(), acl="public-read")
        env = _without_credentials(public.env(tmp_path / "cache"), tmp_path)
        refused = run_cli("convert", url, "-o", tmp_path / "no", env=env)
        one_line_refusal(refused, url, "no credentials found", "AWS_NO_SIGN_REQUEST=YES")
        done = run_cli(
            "convert", url, "-o", tmp_path / "o", env={**env, "AWS_NO_SIGN_REQUEST": "YES"}
        )
        assert done.returncode == 0, _said(done)
        assert _tree(tmp_path / "o" / "CMU-1-Small-Region.ome.zarr") == _tree(local_store)
    finally:
        public.stop()
    unsigned = {**s3.env(tmp_path / "c2"), "AWS_NO_SIGN_REQUEST": "yes"}
    private = run_cli("convert", f"s3://slides/cohort/{CMU}", "-o", tmp_path / "p", env=unsigned)
    one_line_refusal(private, f"s3://slides/cohort/{CMU}", "access refused (403)")


def test_in_place_reading_of_a_url_is_refused(s3, tmp_path):
    done = run_cli(
        "convert", f"s3://slides/cohort/{CMU}", "-o", tmp_path / "o", "--in-place",
        env=s3.env(tmp_path / "c"),
    )  # fmt: skip
    one_line_refusal(done, "--in-place", "local disk")


def test_a_slide_larger_than_the_cache_limit_is_refused_at_the_door(s3, tmp_path):
    """Before the local slide given first is converted, and before anything is fetched."""
    out = tmp_path / "o"
    done = run_cli(
        "convert", SLIDES / IHC, f"s3://slides/cohort/{CMU}", "-o", out, "--cache-limit", "0.001",
        env=s3.env(tmp_path / "c"),
    )  # fmt: skip
    one_line_refusal(done, "more than the slide cache holds", "--cache-limit 0.001")
    assert not list((tmp_path / "c").rglob("*.svs"))
    assert not out.exists() or not any(out.iterdir())


def test_a_killed_fetchs_day_old_temporary_file_is_removed_to_make_room(s3, tmp_path, monkeypatch):
    url = s3.put("stale/slide.svs", (SLIDES / CMU).read_bytes())
    for name, value in s3.env(tmp_path / "c").items():
        monkeypatch.setenv(name, value)
    target = Remote(url, tmp_path / "c")
    target.local.parent.mkdir(parents=True)
    old, new = (target.local.parent / f".slide.svs.{n}.part" for n in ("old", "new"))
    for part in (old, new):
        part.write_bytes(b"partial")
    os.utime(old, (1e9, 1e9))  # 2001: a killed run's
    target.stage()
    assert not old.exists() and new.exists()  # a fetch under way elsewhere is left alone


def test_the_cache_keeps_its_limit_least_recently_used_out_first(s3, tmp_path, monkeypatch):
    data = (SLIDES / CMU).read_bytes()
    urls = [s3.put(f"lru/{name}.svs", data) for name in "abc"]
    for name, value in s3.env(tmp_path / "c").items():
        monkeypatch.setenv(name, value)
    limit = 2.5 * len(data) / 1e9  # two slides fit
    staged = [Remote(u, tmp_path / "c").stage(limit) for u in urls[:2]]
    for when, path in enumerate(staged):  # a before b, whatever the clock's grain
        os.utime(path.with_name(path.name + ".staged.json"), (1e9 + when, 1e9 + when))
    assert Remote(urls[0], tmp_path / "c").stage(limit) == staged[0]  # a used again: now b
    Remote(urls[2], tmp_path / "c").stage(limit)  # is the least recently used
    assert staged[0].is_file() and not staged[1].exists()
    assert sorted(p.name for p in (tmp_path / "c").rglob("*.svs")) == ["a.svs", "c.svs"]


def test_a_transfer_cut_leaves_nothing_that_reads_as_a_slide_and_runs_again(
    s3, tmp_path, monkeypatch
):
    """The server stopped after the first blocks: one line naming the URL, no staged file
    and no part of one; the server back, the same call stages the slide whole."""
    data = (SLIDES / CMU).read_bytes()
    url = s3.put("cut/slide.svs", data)
    for name, value in s3.env(tmp_path / "c").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(remote, "BLOCK", 64 * 1024)
    monkeypatch.setattr(remote, "IN_FLIGHT", 2)
    target = Remote(url, tmp_path / "c")

    def cut(n, total):
        s3.process.kill()  # the link gone mid-transfer
        s3.process.wait(10)

    with pytest.raises(SlideError) as raised:
        target.stage(progress=cut)
    line = str(raised.value)
    assert line.startswith(f"{url}: ") and "\n" not in line and s3.secret not in line
    folder = target.local.parent
    assert not target.local.exists() and not list(folder.glob("*.part"))
    again = start_s3(s3.port)  # the same endpoint back (its objects made again: the
    try:  # module's too, for the tests after this one on this worker)
        again.put(f"cohort/{CMU}", data)
        again.put("cut/slide.svs", data)
        for name, value in again.env(tmp_path / "c").items():
            monkeypatch.setenv(name, value)
        landed = []
        assert target.stage(progress=lambda n, total: landed.append(n)).read_bytes() == data
        assert sum(landed) == len(data)
    finally:
        s3.process, s3.key, s3.secret = again.process, again.key, again.secret


def test_urls_are_known_and_shown_without_their_secrets():
    assert is_url("s3://b/k.svs") and is_url("https://h/x.svs") and is_url("gs://b/x")
    assert not is_url("file:///tmp/x.svs") and not is_url("/tmp/s3://x") and not is_url("x.svs")
    assert not is_url(Path("s3://b/k.svs"))  # a Path has folded its // already
    signed = "https://user:pw@host.example:8443/a/b.svs?X-Amz-Signature=abc123&X-Amz-Credential=k"
    assert shown(signed) == "https://host.example:8443/a/b.svs"
    # as a library quotes it, its query rewritten (yarl turns %2F into /)
    quoted = signed.replace("X-Amz-Credential=k", "X-Amz-Credential=AKIA/2024/us/s3")
    said = remote._said(ValueError(f"403, message='Forbidden', url='{quoted}'"))
    assert "abc123" not in said and "AKIA" not in said and ":pw@" not in said
    assert "url='https://host.example:8443/a/b.svs'" in said
    with pytest.raises(SlideError, match="names no file"):
        _ = Remote("s3://bucket", Path("/tmp")).local
    with pytest.raises(OptionError, match="--in-place"):
        remote.check_urls(["s3://b/k.svs"], in_place=True)


# -- embed: slides from a bucket, converted into --into on the way ----------------------------


def _features(store: Path) -> np.ndarray:
    group = zarr.open_group(store / group_of(store, "efficientnet-lite0"), mode="r")
    return group["features"][:]


EMBED = ("--model", "efficientnet-lite0", "--device", "cpu", "--mpp", "1", "--max-tiles", "8")


def test_embed_from_a_bucket_gives_the_features_of_the_local_slide(s3, tmp_path):
    """`tilestore embed s3://... --into DIR`: the slide staged, converted and embedded; its
    features bit for bit those of the same slide given as a local file; a second run finds
    the store complete (the staged copy's SHA-256 is the recorded one)."""
    url = f"s3://slides/cohort/{CMU}"
    env = s3.env(tmp_path / "cache")
    report = ("--report", tmp_path / "report" / "run.json")
    remote_run = run_cli("embed", url, "--into", tmp_path / "r", *EMBED, *report, env=env)
    assert remote_run.returncode == 0, _said(remote_run)
    local_run = run_cli("embed", SLIDES / CMU, "--into", tmp_path / "l", *EMBED)
    assert local_run.returncode == 0, _said(local_run)
    name = "CMU-1-Small-Region.ome.zarr"
    ours, theirs = _features(tmp_path / "r" / name), _features(tmp_path / "l" / name)
    assert ours.shape[0] > 0 and np.array_equal(ours, theirs, equal_nan=True)
    again = run_cli("embed", url, "--into", tmp_path / "r", *EMBED, env=env)
    assert again.returncode == 0 and "(reused)" in again.stdout, _said(again)
    # the credential nowhere: not said, nor in the report, the store or the cache's records
    outputs = [_said(remote_run), _said(again)]
    folders = [tmp_path / "report", tmp_path / "r", tmp_path / "cache"]
    assert no_secret([s3.secret, s3.key], outputs, folders) > 50


def test_a_store_in_a_bucket_is_read_through_zarrs_own_store(s3, tmp_path, monkeypatch):
    """A store uploaded as it is (one object a file): open_slide and open_embeddings on its
    URL read what the local store reads, through zarr's FsspecStore; the dataset names it
    by its URL."""
    import tilestore

    local = tmp_path / "l"
    done = run_cli("embed", SLIDES / CMU, "--into", local, *EMBED)
    assert done.returncode == 0, _said(done)
    store = local / "CMU-1-Small-Region.ome.zarr"
    client = s3.client()
    for path in (p for p in store.rglob("*") if p.is_file()):
        client.upload_file(str(path), "slides", f"stores/{store.name}/{path.relative_to(store)}")
    for name, value in s3.env(tmp_path / "c").items():
        monkeypatch.setenv(name, value)
    url = f"s3://slides/stores/{store.name}"
    there, here = tilestore.open_slide(url), tilestore.open_slide(store)
    assert str(there.name) == url
    for level in range(len(here.levels)):
        assert np.array_equal(
            there.read_region(0, 0, 600, 500, level=level),
            here.read_region(0, 0, 600, 500, level=level),
        )
    ds = tilestore.open_embeddings(url, "efficientnet-lite0")
    mine = tilestore.open_embeddings(str(store), "efficientnet-lite0")
    assert np.array_equal(ds["features"].values, mine["features"].values, equal_nan=True)
    assert ds.attrs["slides"][0]["store"] == url
    with pytest.raises(tilestore.StoreError, match=re.escape("s3://slides/stores/missing.ome")):
        tilestore.open_slide("s3://slides/stores/missing.ome.zarr")


def test_embed_refuses_a_missing_object_before_the_model_loads(s3, tmp_path):
    url = "s3://slides/cohort/missing.svs"
    done = run_cli("embed", url, "--into", tmp_path / "r", *EMBED, env=s3.env(tmp_path / "c"))
    one_line_refusal(done, url, "not found (404)")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_embed_refuses_a_url_read_in_place(s3, tmp_path):
    url = f"s3://slides/cohort/{CMU}"
    env = s3.env(tmp_path / "c")
    in_place = run_cli("embed", url, "--in-place", *EMBED, env=env)
    one_line_refusal(in_place, "--in-place", "local disk")


def test_on_dask_a_slide_from_a_bucket_is_staged_by_its_worker(s3, tmp_path):
    """`embed s3://... --into DIR --cluster local`: the worker stages the slide and converts
    it (nothing fetched by the coordinator) into the store the local file makes, bit for
    bit; its features those of the local file in one process (to float sums: a Dask worker
    runs torch on one thread); no secret said or written."""
    url = f"s3://slides/cohort/{CMU}"
    env = s3.env(tmp_path / "cache")
    dask = run_cli("embed", url, "--into", tmp_path / "d", "--cluster", "local", *EMBED, env=env)
    assert dask.returncode == 0, _said(dask)
    assert f"converted {url} -> " in dask.stdout
    local = run_cli("embed", SLIDES / CMU, "--into", tmp_path / "l", *EMBED)
    assert local.returncode == 0, _said(local)
    name = "CMU-1-Small-Region.ome.zarr"
    levels = [
        {k: v for k, v in store_tree(tmp_path / where / name, source_time=False).items()
         if not k.startswith("embeddings")}
        for where in ("d", "l")
    ]  # fmt: skip
    assert levels[0] == levels[1] and len(levels[0]) > 10
    ours, theirs = _features(tmp_path / "d" / name), _features(tmp_path / "l" / name)
    assert ours.shape == theirs.shape and ours.shape[0] > 0
    np.testing.assert_allclose(ours.astype(np.float32), theirs, rtol=2e-3, atol=2e-3)
    assert no_secret([s3.secret, s3.key], [_said(dask)], [tmp_path / "d", tmp_path / "cache"])


def test_a_slide_held_by_a_process_is_never_removed_to_make_room(s3, tmp_path, monkeypatch):
    data = (SLIDES / CMU).read_bytes()
    urls = [s3.put(f"held/{name}.svs", data) for name in "abc"]
    for name, value in s3.env(tmp_path / "c").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TILESTORE_CACHE", str(tmp_path / "c"))
    limit = 1.5 * len(data) / 1e9  # one slide fits
    with remote.slide_file(urls[0], limit) as held:
        assert held.read_bytes() == data
        Remote(urls[1], tmp_path / "c").stage(limit)  # over the limit, but a is held: kept
        assert held.is_file()
    Remote(urls[2], tmp_path / "c").stage(limit)  # a and b held by none: both make room
    assert sorted(p.name for p in (tmp_path / "c").rglob("*.svs")) == ["c.svs"]


def test_a_copy_staged_from_another_endpoint_is_not_taken_for_this_ones(s3, tmp_path):
    """Two S3 servers, one bucket and key each, other bytes: the cache file is the same
    path, its record tells them apart, so the second is fetched, not reused."""
    data = (SLIDES / CMU).read_bytes()
    url = s3.put("endpoints/slide.svs", data)
    other = start_s3()
    try:
        other.put("endpoints/slide.svs", data[:-1] + bytes([data[-1] ^ 1]))  # same size
        cache = tmp_path / "c"
        first = Remote(url, cache)
        env_first, env_other = s3.env(cache), other.env(cache)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env_first.items():
                mp.setenv(name, value)
            assert first.stage().read_bytes() == data
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env_other.items():
                mp.setenv(name, value)
            assert Remote(url, cache).stage().read_bytes() != data
    finally:
        other.stop()


def test_two_signed_urls_bound_for_one_store_are_refused_without_their_signatures(tmp_path):
    signed = [f"https://h.example/{d}/x.svs?X-Amz-Signature=SECRET{d}" for d in "ab"]
    done = run_cli("convert", *signed, "-o", tmp_path / "o")
    one_line_refusal(done, "https://h.example/b/x.svs", "its store would be")
    assert "SECRET" not in _said(done)


@pytest.mark.parametrize("throttled, code", [(2, 0), (1000, 2)])
def test_a_throttling_server_is_retried_then_said_inone_line_refusal(s3, tmp_path, throttled, code):
    """503 SlowDown on the first requests: retried (s3fs's, then botocore's attempts), the
    slide converted; throttled for ever: one line saying so, exit 2, nothing converted."""
    with Proxy(s3.port, throttle=throttled) as proxy:
        env = s3.env(tmp_path / "c", AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
        done = run_cli("convert", f"s3://slides/cohort/{CMU}", "-o", tmp_path / "o", env=env)
    assert proxy.throttled == throttled if code == 0 else proxy.throttled > 2
    if code == 0:
        assert done.returncode == 0, _said(done)
        assert (tmp_path / "o" / "CMU-1-Small-Region.ome.zarr" / "zarr.json").is_file()
    else:
        one_line_refusal(done, f"s3://slides/cohort/{CMU}", "throttles (503 SlowDown)")
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("limit", [float("nan"), 0, -1, 1e30, "x"])
def test_a_cache_limit_outside_its_range_is_refused_through_the_api_too(tmp_path, limit):
    """Before any request (no server here): the CLI's --cache-limit is held to the same."""
    with pytest.raises(OptionError, match="must be a number of GB above 0"):
        Remote("s3://b/k.svs", tmp_path).stage(limit)
    with pytest.raises(OptionError, match="must be a number of GB above 0"):
        remote.stage_slide("s3://b/k.svs", limit)


def test_info_describes_a_slide_in_a_bucket_as_its_local_file(s3, tmp_path):
    """`tilestore info s3://...`: the slide staged and described as the same file on disk is
    (levels, pixel size, codec: every field but its path), named by its URL; a missing object
    is one line, exit 2; a store in a bucket is refused in one line."""
    env = s3.env(tmp_path / "cache")
    there = run_cli("info", f"s3://slides/cohort/{CMU}", "--json", env=env)
    assert there.returncode == 0, _said(there)
    here = run_cli("info", SLIDES / CMU, "--json")
    assert here.returncode == 0, _said(here)
    ours, theirs = json.loads(there.stdout), json.loads(here.stdout)
    assert ours.pop("path") == f"s3://slides/cohort/{CMU}"
    assert Path(ours.pop("staged")).read_bytes() == (SLIDES / CMU).read_bytes()
    theirs.pop("path")
    assert ours == theirs and ours["levels"]
    shown = run_cli("info", f"s3://slides/cohort/{CMU}", env=env)
    assert shown.returncode == 0 and f"s3://slides/cohort/{CMU}" in shown.stdout, _said(shown)
    missing = run_cli("info", "s3://slides/cohort/nothing.svs", env=env)
    one_line_refusal(missing, "s3://slides/cohort/nothing.svs")
    store = run_cli("info", "s3://slides/stores/a.ome.zarr", env=env)  # a store: read there
    one_line_refusal(store, "s3://slides/stores/a.ome.zarr", "cannot open store")
    no_secret([s3.secret, s3.key], [_said(d) for d in (there, shown, missing, store)], [])


def test_a_server_that_does_not_answer_is_said_so_at_the_door(tmp_path):
    """No server at the endpoint: one line naming the URL, exit 2, before any work."""
    import socket

    from tests.s3 import S3

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = S3(None, port, "key", "secret").env(tmp_path / "c")
    url = f"s3://slides/cohort/{CMU}"
    done = run_cli("convert", url, "-o", tmp_path / "o", env=env)
    one_line_refusal(done, url, "the server did not answer", "run again once it answers")
    assert not (tmp_path / "o").exists()
