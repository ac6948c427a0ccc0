"""Batch sizes: chosen as the smallest within 3% of the best tiles/s, remembered per model,
device, precision and torch version, searched again where the memo does not apply."""

from __future__ import annotations

import json

import pytest
import torch

from tilestore.embed import sizing
from tilestore.embed.sizing import BatchRun, Profile, choose_batch, profile_batches


def _profile(*rates):
    runs = tuple(BatchRun(b, r, None if r is None else b * 3.0) for b, r in rates)
    return Profile("m", "GPU", "bf16", 80_000.0, 300.0, runs)


@pytest.mark.parametrize(
    ("rates", "chosen"),
    [
        # gains under 5% per doubling, adding up: the old rule (stop where doubling gains
        # under 5%) stopped at 128, 4.5% below the best
        (((32, 5000), (64, 8000), (128, 9600), (256, 9800), (512, 10000), (1024, 10050)), 256),
        (((32, 5000), (64, 8000), (128, 9900), (256, 9950), (512, 10000)), 128),
        # out of memory bounds the search; the best that fits wins
        (((32, 900), (64, 1200), (128, None)), 64),
        # a dip (noise, a slow kernel at one size) does not end the search early
        (((32, 1000), (64, 900), (128, 2000), (256, 2010)), 128),
    ],
)
def test_the_smallest_batch_within_3_percent_of_the_best(rates, chosen):
    assert _profile(*rates).choose() == chosen


def test_nothing_fits_is_an_out_of_memory_error():
    with pytest.raises(torch.OutOfMemoryError, match="no batch of 32 fits"):
        _profile((32, None)).choose()


def test_profile_measures_each_size_on_the_cpu(lite):
    profile = profile_batches(lite, torch.device("cpu"), "fp32", batches=(2, 4), repeats=1)
    assert [r.batch for r in profile.runs] == [2, 4]
    assert all(r.tiles_per_s > 0 and r.peak_mb is None for r in profile.runs)
    assert profile.model == "efficientnet-lite0" and profile.total_mb is None


def test_a_runs_search_times_a_slow_size_twice_and_a_quick_one_up_to_repeats(lite, monkeypatch):
    """enough_s: as many timed batches as take about that long, judged by the untimed one:
    a size slower than it twice, never fewer; a quick one up to `repeats`."""
    calls: dict[int, int] = {}
    clock = iter(range(1000))  # each forward "takes" one second of this clock

    class Counted:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, tiles, batch):
            calls[batch] = calls.get(batch, 0) + 1

    monkeypatch.setattr(sizing, "Forward", Counted)
    monkeypatch.setattr(sizing.time, "perf_counter", lambda: float(next(clock)))
    cpu = torch.device("cpu")
    profile_batches(lite, cpu, "fp32", batches=(2, 4), repeats=5, enough_s=0.5)
    assert calls == {2: 3, 4: 3}  # 1 untimed + 2 timed: a batch "took" 1 s, over 0.5
    calls.clear()
    profile_batches(lite, cpu, "fp32", batches=(2,), repeats=5, enough_s=30)
    assert calls == {2: 6}  # 1 untimed + repeats: 30 s wanted, 5 at most
    calls.clear()
    profile_batches(lite, cpu, "fp32", batches=(2,), repeats=3)
    assert calls == {2: 4}  # without enough_s: exactly `repeats` (models profile --repeats)


def test_a_runs_search_is_judged_by_a_timed_batch_not_the_warm_up(lite, monkeypatch):
    """The untimed first batch chooses kernels and grows memory pools: ten times a steady
    batch here. A quick size (0.1 s a batch, 0.5 s wanted) is timed `repeats` times, not
    twice as its warm-up would say."""
    calls: list[int] = []
    now = [0.0]

    class Warming:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, tiles, batch):
            now[0] += 1.0 if not calls else 0.1
            calls.append(batch)

    monkeypatch.setattr(sizing, "Forward", Warming)
    monkeypatch.setattr(sizing.time, "perf_counter", lambda: now[0])
    profile = profile_batches(lite, torch.device("cpu"), "fp32", (2,), repeats=5, enough_s=0.5)
    assert len(calls) == 1 + 5
    assert profile.runs[0].tiles_per_s == pytest.approx(2 / 0.1)


def test_a_choice_is_remembered_per_key_and_a_bad_memo_is_searched_again(
    lite, tmp_path, monkeypatch
):
    searched = []

    def fake_profile(loaded, device, precision, enough_s):
        assert enough_s == sizing.ENOUGH_S  # a run's search: each size timed about this long
        searched.append(precision)
        return _profile((32, 100), (64, 300), (128, 305))

    monkeypatch.setattr(sizing, "profile_batches", fake_profile)
    memo, cpu = tmp_path / "cache" / "batch-sizes.json", torch.device("cpu")
    batch, how = choose_batch(lite, cpu, "fp32", memo)
    assert (batch, searched) == (64, ["fp32"]) and how.startswith("searched (tiles/s per batch")
    key = sizing.choice_key(lite, cpu, "fp32")
    assert torch.__version__ in key and "efficientnet-lite0" in key
    assert json.loads(memo.read_text())[key]["batch"] == 64
    # the next task of the array: no search
    assert choose_batch(lite, cpu, "fp32", memo)[0] == 64 and searched == ["fp32"]
    assert "remembered from a search on" in choose_batch(lite, cpu, "fp32", memo)[1]
    # another precision (or GPU, or torch) is another key: searched, both kept
    choose_batch(lite, cpu, "bf16", memo)
    assert searched == ["fp32", "bf16"] and len(json.loads(memo.read_text())) == 2
    # a damaged memo is not trusted: searched again and rewritten
    memo.write_text('{"half a file')
    assert choose_batch(lite, cpu, "fp32", memo)[0] == 64 and searched[-1] == "fp32"
    assert len(searched) == 3 and key in json.loads(memo.read_text())
    # a memo entry that is not a batch size is not used
    memo.write_text(json.dumps({key: {"batch": "big"}}))
    choose_batch(lite, cpu, "fp32", memo)
    assert len(searched) == 4


def test_the_memo_lives_in_the_user_cache_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv("TILESTORE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert sizing.choice_file() == tmp_path / "xdg" / "tilestore" / "batch-sizes.json"
    monkeypatch.setenv("TILESTORE_CACHE", str(tmp_path / "shared"))
    assert sizing.choice_file() == tmp_path / "shared" / "batch-sizes.json"
