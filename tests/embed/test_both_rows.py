"""`BothRows`: rows go to the decoder processes while they have room, else to nvJPEG, and
come back in order, every chunk (c, h, w), whichever decoded it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embed import rows as rows_module
from tilestore.embed.report import no_span
from tilestore.embed.rows import BothRows


class FakeSource:
    """A row source that 'decodes' row i's chunks as tensors filled with i, laid out as the
    real one lays them out ((h, w, c) from the processes, (c, h, w) from nvJPEG)."""

    def __init__(self, channels_last: bool, ahead: int, group: int) -> None:
        self.channels_last, self.ahead, self.group = channels_last, ahead, group
        self.submitted: list[int] = []
        self.in_flight = 0
        self.abandoned: list[int] = []
        self.closed = False

    def _wants_more(self, index: int) -> bool:
        return self.in_flight < self.group

    def _submit(self, index, coords):
        self.submitted.append(index)
        self.in_flight += 1
        return index

    def _result(self, index, coords, pending):
        assert pending == index
        self.in_flight -= 1
        shape = (4, 5, 3) if self.channels_last else (3, 4, 5)
        return [torch.full(shape, float(index)) for _ in coords]

    def _abandon(self, pending) -> None:
        self.abandoned.append(pending)

    def retire(self, chunks) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def both(steps: int, ahead: int, group: int) -> BothRows:
    """A BothRows over fake sources: processes with room for `ahead` rows, nvJPEG taking
    `group` rows in flight."""
    cpu, gpu = FakeSource(True, ahead, 0), FakeSource(False, 0, group)
    plan = [SimpleNamespace(load=np.array([[i, 0], [i, 1]])) for i in range(steps)]
    settings = SimpleNamespace(device=torch.device("cpu"), readers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rows_module, "ProcessRows", lambda *a, **k: cpu)
        patch.setattr(rows_module, "NvjpegRows", lambda *a, **k: gpu)
        return BothRows(plan, settings, no_span, None, None, None, None)


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(1, 30), ahead=st.integers(1, 4), group=st.integers(1, 6))
def test_rows_come_back_in_order_channels_first_from_either(steps, ahead, group):
    source = both(steps, ahead, group)
    with source:
        for i in range(steps):
            coords, chunks = source.take(i)
            assert coords == [(i, 0), (i, 1)]
            assert all(c.shape == (3, 4, 5) and bool((c == i).all()) for c in chunks)
            assert source._cpu_rows <= ahead  # never more rows with the processes than room
    cpu, gpu = source.cpu, source.gpu
    assert sorted(cpu.submitted + gpu.submitted) == list(range(steps))  # each row once
    assert cpu.submitted[: min(ahead, steps)] == list(range(min(ahead, steps)))  # CPU first
    assert source.rows == {"cpu": len(cpu.submitted), "gpu": len(gpu.submitted)}
    assert cpu.closed and gpu.closed


def test_rows_never_taken_are_abandoned_where_they_went():
    source = both(steps=12, ahead=2, group=3)
    source.take(0)  # rows ahead of it were submitted to both
    cpu, gpu = source.cpu, source.gpu
    source.close()
    assert set(cpu.abandoned) == set(cpu.submitted) - {0}
    assert set(gpu.abandoned) == set(gpu.submitted)
    assert gpu.submitted  # the processes were full: nvJPEG took rows
