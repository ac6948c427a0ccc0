"""`tilestore convert` of many slides at once (issue 68): the slides spread over processes,
each store the same as one converted alone, each refusal its own line, exit 2."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import run_cli, store_tree
from tilestore.conversion.many import slides_at_once


@pytest.mark.parametrize(
    ("slides", "asked", "cpus", "expected"),
    [(400, "auto", 16, 8), (3, "auto", 16, 3), (1, "auto", 16, 1), (10, "auto", 1, 1),
     (10, 4, 2, 4), (2, 8, 16, 2)],
)  # fmt: skip
def test_how_many_at_once(slides, asked, cpus, expected):
    assert slides_at_once(slides, asked, cpus) == expected


SMALL, LARGE = 2 * 2**20, 400 * 2**20  # a crop's file; a slide's


@pytest.mark.parametrize(
    ("sizes", "asked", "expected"),
    [([SMALL] * 400, "auto", 16), ([LARGE] * 400, "auto", 8), ([SMALL, LARGE] * 200, "auto", 8),
     ([SMALL, None] * 200, "auto", 8), ([SMALL] * 400, 4, 4), ([SMALL] * 3, "auto", 3)],
)  # fmt: skip
def test_auto_converts_small_slide_files_one_a_cpu(sizes, asked, expected):
    """'auto': a slide a CPU where every file's size is known and they are small on average
    (a small slide's conversion is one thread's work), else one per 2 CPUs (a URL's size is
    not known: as a large one)."""
    assert slides_at_once(len(sizes), asked, 16, sizes) == expected


def test_file_sizes_are_the_files_and_none_for_urls(tmp_path):
    from tilestore.conversion.many import file_sizes

    (tmp_path / "a.svs").write_bytes(b"x" * 10)
    paths = [tmp_path / "a.svs", "s3://bucket/b.svs", tmp_path / "absent.svs"]
    assert file_sizes(paths) == [10, None, None]


@pytest.mark.slow
def test_slides_at_once_are_the_stores_one_at_a_time_and_refusals_stay_per_slide(
    tmp_path, slide_path
):
    source = slide_path("CMU-1-Small-Region.svs")
    folder = tmp_path / "slides"
    folder.mkdir()
    for name in ("a", "b", "c"):
        (folder / f"{name}.svs").symlink_to(source)
    (folder / "bad.svs").write_bytes(b"not a slide at all")
    given = [folder / "a.svs", folder / "bad.svs", folder / "b.svs", folder / "c.svs"]
    alone = run_cli("convert", *given, "-o", tmp_path / "alone", "--at-once", "1")
    many = run_cli("convert", *given, "-o", tmp_path / "many", "--at-once", "3")
    assert alone.returncode == many.returncode == 2, many.stderr
    errors = [line for line in many.stderr.splitlines() if line.startswith("tilestore: error")]
    assert errors == [
        line for line in alone.stderr.splitlines() if line.startswith("tilestore: error")
    ]
    assert len(errors) == 1 and str(folder / "bad.svs") in errors[0], errors
    made = sorted(path.name for path in (tmp_path / "many").iterdir())
    assert made == ["a.ome.zarr", "b.ome.zarr", "c.ome.zarr"]  # the bad one: nothing
    said = "".join(many.stdout.split())  # a long path is folded at the console's width
    told = [said.find(f"many/{name}.ome.zarr") for name in "abc"]
    assert -1 not in told and told == sorted(told)  # each told, in the order given
    made = store_tree(tmp_path / "many")
    assert made == store_tree(tmp_path / "alone")  # bit for bit, the creation time aside
    assert not any(key.startswith("bad") for key in made)  # nothing left that looks valid


def test_two_slides_bound_for_one_store_are_refused_before_any_is_converted(tmp_path, slide_path):
    """Two slides of one name from two folders, or two slides into one named store: the
    second would find the first's store made, after its own conversion. One line each, exit
    2, nothing made, whether converted at once or in turn. One file given again (by two
    paths) is converted once."""
    source = slide_path("CMU-1-Small-Region.svs")
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "s.svs").write_bytes(source.read_bytes())
    first, second = tmp_path / "x" / "s.svs", tmp_path / "y" / "s.svs"
    out = tmp_path / "out"
    for at_once in ("1", "2"):
        done = run_cli("convert", first, second, "-o", out, "--at-once", at_once)
        assert done.returncode == 2
        assert done.stderr.strip() == (
            f"tilestore: error: {second}: its store would be {out / 's.ome.zarr'}, as "
            f"{first}'s: each needs a store of its own (slides of one name: a folder each)"
        )
        assert not out.exists()
    done = run_cli("convert", first, second, "-o", out / "one.ome.zarr")  # one store named
    assert done.returncode == 2 and "its store would be" in done.stderr
    again = tmp_path / "x" / ".." / "x" / "s.svs"  # one file given again: converted once
    done = run_cli("convert", first, again, "-o", out, "--at-once", "2")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == ["s.ome.zarr"]
    shutil.rmtree(out)
    other = tmp_path / "y" / "t.svs"
    second.rename(other)  # named apart: both converted
    done = run_cli("convert", first, other, "-o", out, "--at-once", "2")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["s.ome.zarr", "t.ome.zarr"]
