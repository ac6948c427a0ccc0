"""The tissue mask made beside a conversion (`convert(..., tissue=...)`): written coarse levels
first, the mask computed from its level while the finer ones are copied, stored before the
store appears, and the very mask `compute_tissue` makes of the finished store."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import warnings
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import CMU, IHC, KIDNEY, NDPI
from tests.tilestore import tiffs
from tilestore.conversion import beside as beside_module
from tilestore.conversion import convert, open_in_place
from tilestore.conversion.converter import write_order
from tilestore.errors import OptionError, SlideError, StoreError, TilestoreWarning
from tilestore.masks.tissue import compute_tissue, levels_read, read_tissue
from tilestore.plan import PlanOptions, plan_tissue
from tilestore.reading import Slide, open_slide


@pytest.fixture
def pyramid(tmp_path, cmu_pixels):
    """Three levels of real H&E (0.25, 0.5, 1 um/px): the mask reads the slide's level 2."""
    return tiffs.ome_pyramid(tmp_path / "p.ome.tif", np.ascontiguousarray(cmu_pixels), 0.25)


def _same_mask(made, want):
    """Every field of the stored mask equals the one computed on the finished store."""
    np.testing.assert_array_equal(made.mask, want.mask)
    assert {k: v for k, v in asdict(made).items() if k != "mask"} == {
        k: v for k, v in asdict(want).items() if k != "mask"
    }


@pytest.fixture
def started(monkeypatch):
    """The mask's processes, as started (`workers.start` watched)."""
    procs, start = [], beside_module.workers.start

    def watched(module, *args, **kwargs):
        procs.append(start(module, *args, **kwargs))
        return procs[-1]

    monkeypatch.setattr(beside_module.workers, "start", watched)
    return procs


@pytest.mark.parametrize("where", ["thread", "process"])
@pytest.mark.parametrize(
    ("name", "method", "overlaps"),
    [
        (CMU, "otsu", False),
        (CMU, "contrast", False),
        (NDPI, "auto", True),
        ("pyramid", "otsu", True),
    ],
)
def test_the_mask_made_beside_is_the_one_the_finished_store_gives(
    name, method, overlaps, where, slide_path, pyramid, tmp_path, monkeypatch, started
):
    """On the thread, or in a process of its own (every mask large enough for one, here:
    `PROCESS_PX` 0) where the level it reads is written before the last one: not CMU's, whose
    one source level is written first and its built levels after (the mask reads the last),
    nor a contrast mask, which reads every level. The thread's mask cannot stand in for the
    process's here: the thread would fail."""
    if where == "process":
        monkeypatch.setattr(beside_module, "PROCESS_PX", 0)
        monkeypatch.setattr(beside_module, "compute_tissue", lambda *a: 1 / 0)
    else:
        monkeypatch.setattr(beside_module, "PROCESS_PX", 1 << 60)
    source = pyramid if name == "pyramid" else slide_path(name)
    if where == "process" and not overlaps:  # on the thread, which fails as told
        with pytest.raises(ZeroDivisionError):
            convert(source, tmp_path / "with", tissue=method)
        assert not started
        return
    report = convert(source, tmp_path / "with", tissue=method)
    assert len(started) == (where == "process")
    assert all(proc.poll() is not None for proc in started)  # ended with the conversion
    assert report.tissue.startswith(
        f"tissue mask computed ({'otsu' if method == 'auto' else method}"
    )
    made = read_tissue(open_slide(report.store))  # there as the store appears
    plain = open_slide(convert(source, tmp_path / "without").store)
    assert read_tissue(plain) is None
    _same_mask(made, compute_tissue(plain, method))
    assert [lv.path for lv in report.levels] == [str(i) for i in range(len(report.levels))]


@pytest.mark.parametrize(
    ("name", "method"), [(CMU, "otsu"), (KIDNEY, "otsu"), ("pyramid", "auto"), (CMU, "contrast")]
)
def test_the_levels_a_mask_reads_are_those_it_waits_for(
    name, method, slide_path, pyramid, tmp_path, monkeypatch
):
    """What the thread waits for (`levels_read`) holds every level `compute_tissue` reads:
    with a pixel size and without (KIDNEY has none), a built level and a slide's own."""
    source = pyramid if name == "pyramid" else slide_path(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TilestoreWarning)  # no pixel size
        slide = open_slide(convert(source, tmp_path).store)
    read, level_of = set(), Slide._read_level

    def watched(self, level, *args):
        read.add(level)
        return level_of(self, level, *args)

    monkeypatch.setattr(Slide, "_read_level", watched)
    compute_tissue(slide, method)
    assert read and read <= levels_read(slide, method)


def test_a_sidecar_is_made_with_its_mask(pyramid, tmp_path, monkeypatch, started):
    """On the thread, however large: in place the sidecar's own work is short."""
    monkeypatch.setattr(beside_module, "PROCESS_PX", 0)
    slide = open_in_place(pyramid, tmp_path / "side", tissue="otsu")
    bare = open_in_place(pyramid, tmp_path / "bare")
    _same_mask(read_tissue(slide), compute_tissue(bare, "otsu"))
    assert not started


def test_only_a_large_mask_beside_a_copy_gets_a_process(pyramid, tmp_path, monkeypatch, started):
    """The level the mask reads, against `PROCESS_PX`: at it, a process; one pixel under, none."""
    plain = open_slide(convert(pyramid, tmp_path / "plain").store)
    (level,) = levels_read(plain, "otsu")
    _, h, w = plain.levels[level].shape
    for px, processes in ((h * w + 1, 0), (h * w, 1)):
        monkeypatch.setattr(beside_module, "PROCESS_PX", px)
        convert(pyramid, tmp_path / f"at-{px}", tissue="otsu")
        assert len(started) == processes


# a mask process's stand-ins: killed while it writes its (long) answer, and one that ignores
# SIGTERM and never answers
CUT_SHORT = (
    'import os, sys; sys.stdin.readline(); sys.stdout.write(\'{"mask": "gAS\');'
    " sys.stdout.flush(); os._exit(137)"
)
STUBBORN = (  # says on its stderr once SIGTERM is ignored
    "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('deaf', file=sys.stderr, flush=True); sys.stdin.read()"
)


def _stand_in(code, stderr=None):
    """`workers.start` starting this code in place of the mask's process."""

    def start(module, env=None, *, session=False):
        return subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, text=True, bufsize=1, start_new_session=session,
        )  # fmt: skip

    return start


@pytest.mark.parametrize("dies", ["before it is asked", "while it answers"])
def test_a_mask_process_that_dies_leaves_the_mask_to_the_thread(
    dies, pyramid, tmp_path, monkeypatch, started
):
    """Killed before it answers (out of memory, a signal), or while it writes its answer
    (half a line): the same mask, made on the thread."""
    monkeypatch.setattr(beside_module, "PROCESS_PX", 0)
    if dies == "before it is asked":
        written = beside_module.TissueBeside.written

        def killed_first(self, level):
            self._proc.kill()
            self._proc.wait()
            written(self, level)

        monkeypatch.setattr(beside_module.TissueBeside, "written", killed_first)
    else:
        monkeypatch.setattr(beside_module.workers, "start", _stand_in(CUT_SHORT))
    report = convert(pyramid, tmp_path / "with", tissue="otsu")
    if dies == "before it is asked":
        assert started and started[0].returncode < 0
    plain = open_slide(convert(pyramid, tmp_path / "without").store)
    _same_mask(read_tissue(open_slide(report.store)), compute_tissue(plain, "otsu"))


def test_a_mask_process_that_ignores_sigterm_is_stopped(pyramid, tmp_path, monkeypatch):
    """A process that would never end on SIGTERM (a caller run with it ignored passes that on)
    and never answers: a conversion that fails ends at once, its process killed."""
    from tilestore.conversion import converter

    monkeypatch.setattr(beside_module, "PROCESS_PX", 0)
    procs, start = [], _stand_in(STUBBORN, stderr=subprocess.PIPE)
    monkeypatch.setattr(
        beside_module.workers, "start", lambda *a, **k: procs.append(start(*a, **k)) or procs[-1]
    )
    level_of = converter._write_source_level

    def failing(level, array, *args):
        if array.path == "0":
            assert procs[0].stderr.readline() == "deaf\n"  # the stand-in has set its handler
            raise SlideError("level 0 is damaged")
        return level_of(level, array, *args)

    monkeypatch.setattr(converter, "_write_source_level", failing)
    hung = []  # the watchdog's: a conversion that waited on the stubborn process
    watchdog = threading.Timer(60, lambda: [hung.append(p.kill()) for p in procs])
    watchdog.start()
    try:
        with pytest.raises(SlideError):
            convert(pyramid, tmp_path / "out", tissue="otsu")
    finally:
        watchdog.cancel()
        for proc in procs:
            proc.stderr.close()
    assert not hung  # ended by the conversion, not by the watchdog
    assert procs and procs[0].returncode == -signal.SIGKILL


def test_a_finished_conversion_stops_its_idle_mask_process_under_an_ignored_sigterm(
    slide_path, tmp_path
):
    """Run as a script that ignores SIGTERM (a `&` job's way), so the mask's process does
    too: the conversion still returns once its mask is stored (the process, idle, killed)."""
    script = (
        "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "from tilestore.conversion import beside, convert\n"
        "beside.PROCESS_PX = 0\n"
        "print(convert(sys.argv[1], sys.argv[2], tissue='otsu').tissue)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(slide_path(NDPI)), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tissue mask computed (otsu")


def test_a_mask_reply_keeps_every_field(slide_path, tmp_path):
    """The mask as the process sends it back: its bits and each field, as they were."""
    mask = compute_tissue(open_slide(convert(slide_path(CMU), tmp_path).store), "otsu")
    back, seconds = beside_module._unpacked(beside_module._packed(mask, 1.5))
    _same_mask(back, mask)
    assert seconds == 1.5 and back.mask.dtype == bool
    assert beside_module._unpacked(beside_module._packed(None, 0.25)) == (None, 0.25)


def test_the_mask_starts_once_its_level_is_written_before_level_0(pyramid, tmp_path, monkeypatch):
    calls = []
    written = beside_module.TissueBeside.written

    def watched(self, level):
        written(self, level)
        calls.append((level, self._future is not None))

    monkeypatch.setattr(beside_module.TissueBeside, "written", watched)
    convert(pyramid, tmp_path / "s", tissue="otsu")
    # the slide's coarsest level first; the mask is under way before levels 1 and 0
    assert calls == [(2, True), (1, True), (0, True)]


@pytest.mark.parametrize("broken", ["level 0", "mask", "level 0, a process", "mask, a process"])
def test_a_conversion_or_mask_that_fails_leaves_nothing_and_no_thread(
    broken, pyramid, tmp_path, monkeypatch, started
):
    """Level 0 failing while the mask is computed, or the mask failing with a bug (not a
    TilestoreError), on the thread or in a process: the error surfaces, the hidden build
    folder is gone, the mask's thread and process have ended before it was removed."""
    from tilestore.conversion import converter

    if broken.endswith("a process"):
        monkeypatch.setattr(beside_module, "PROCESS_PX", 0)
    if broken == "mask, a process":  # the process cannot open the folder: its traceback
        written = beside_module.TissueBeside.written

        def misdirected(self, level):
            asked = json.loads(self._request)
            self._request = json.dumps({**asked, "folder": str(tmp_path / "not-there")})
            written(self, level)

        monkeypatch.setattr(beside_module.TissueBeside, "written", misdirected)
        with pytest.raises(RuntimeError, match=r"tissue mask beside .* failed:\n.*Traceback"):
            convert(pyramid, tmp_path / "out", tissue="otsu")
        assert not list((tmp_path / "out").iterdir())
        assert len(started) == 1 and started[0].poll() is not None
        return
    if broken.startswith("level 0"):
        level_of = converter._write_source_level

        def failing(level, array, *args):
            if array.path == "0":
                raise SlideError("level 0 is damaged")
            return level_of(level, array, *args)

        monkeypatch.setattr(converter, "_write_source_level", failing)
    else:
        monkeypatch.setattr(beside_module, "compute_tissue", lambda *a: 1 / 0)
    with pytest.raises(SlideError if broken.startswith("level 0") else ZeroDivisionError):
        convert(pyramid, tmp_path / "out", tissue="otsu")
    assert not list((tmp_path / "out").iterdir())
    assert not [t for t in threading.enumerate() if t.name.startswith("tilestore-tissue")]
    assert len(started) == broken.endswith("a process")
    assert all(proc.poll() is not None for proc in started)


def test_a_mask_that_cannot_be_made_leaves_the_conversion_whole(slide_path, tmp_path):
    """No pixel size: the contrast rule cannot run. The store is made without a mask, and
    the plan refuses as it did (no silent mask)."""
    with pytest.warns(TilestoreWarning) as said:
        report = convert(slide_path(IHC), tmp_path, tissue="contrast")
    assert any("no pixel size" in str(w.message) for w in said)
    slide = open_slide(report.store)
    assert report.tissue is None and read_tissue(slide) is None
    with pytest.raises(StoreError, match="needs a known pixel size"):
        plan_tissue(slide, PlanOptions(tissue_method="contrast"))


@pytest.mark.parametrize("make", [convert, open_in_place])
def test_a_tissue_method_that_is_not_one_is_refused_before_any_store(make, pyramid, tmp_path):
    """A mistyped method is one line naming it, not a store made quietly without its mask
    (the mask's own refusal is a TilestoreError, which the thread leaves to the plan)."""
    with pytest.raises(OptionError, match="tissue='otsx'"):
        make(pyramid, tmp_path / "s", tissue="otsx")
    assert not any(tmp_path.glob("s*"))


@given(st.integers(1, 6), st.integers(0, 6))
def test_every_level_is_written_once_each_after_the_one_it_is_built_from(sources, built):
    order = write_order(sources, sources + built)
    assert sorted(order) == list(range(sources + built))
    assert order[0] == sources - 1  # the slide's coarsest first: what a mask reads
    for level in range(sources, sources + built):  # built from the level before it
        assert order.index(level - 1) < order.index(level)
