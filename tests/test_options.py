"""Options declared once (`tilestore.options`): every record and declared function refuses
what its declaration does not allow, keeps what it does, and says it in one line naming the
option, the value and the range; a sentinel is a named value, never a 0."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilestore.embed import Options
from tilestore.errors import OptionError
from tilestore.masks import ContrastRule
from tilestore.options import Declaration, declarations
from tilestore.plan import PlanOptions
from tilestore.qc import QCOptions

RECORDS = (PlanOptions, Options, QCOptions, ContrastRule)
NUMERIC = [
    (cls, d) for cls in RECORDS for d in declarations(cls).values() if d.kind.number is not None
]


def _allowed(d: Declaration, value: float) -> bool:
    """Whether a number is in the declared range (the rule, written out again here)."""
    opt = d.opt
    if not math.isfinite(value):
        return False
    if d.kind.number is int and value != int(value):
        return False
    if opt.low is not None and (value <= opt.low if opt.above else value < opt.low):
        return False
    if opt.high is not None and value > opt.high:
        return False
    return opt.multiple is None or value % opt.multiple == 0


@pytest.mark.parametrize(
    ("cls", "declaration"), NUMERIC, ids=[f"{c.__name__}.{d.name}" for c, d in NUMERIC]
)
@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers()))
def test_a_record_keeps_a_number_exactly_when_its_declaration_allows_it(cls, declaration, value):
    allowed = _allowed(declaration, float(value)) if abs(value) < 1e300 else False
    if allowed:
        kept = getattr(cls(**{declaration.name: value}), declaration.name)
        assert kept == value and type(kept) is declaration.kind.number
    else:
        with pytest.raises(OptionError) as refused:
            cls(**{declaration.name: value})
        message = str(refused.value)
        assert message.startswith(f"{declaration.name}=") and "must be" in message
        assert "\n" not in message


@pytest.mark.parametrize(
    ("cls", "declaration"), NUMERIC, ids=[f"{c.__name__}.{d.name}" for c, d in NUMERIC]
)
def test_nan_infinities_and_huge_numbers_are_never_an_option(cls, declaration):
    for value in (math.nan, math.inf, -math.inf, 1e30, -1e30, 10**18):
        with pytest.raises(OptionError, match=rf"^{declaration.name}="):
            cls(**{declaration.name: value})


# where 0 (or less) is a real quantity, not a sentinel: fractions, thresholds, tolerances
ZERO_IS_A_VALUE = {
    "min_tissue",
    "min_roi",
    "tolerance",
    "max_artefact",
    "max_blur",
    "max_min",
    "min_max",
    "max_p5",
    "max_median",
}


@pytest.mark.parametrize(
    ("cls", "declaration"), NUMERIC, ids=[f"{c.__name__}.{d.name}" for c, d in NUMERIC]
)
def test_zero_is_refused_wherever_it_would_be_a_sentinel(cls, declaration):
    """0 is taken only where it is a quantity (a fraction, a threshold); elsewhere it once
    meant "the default" or "level-0 pixels" silently, and is refused now."""
    if declaration.name in ZERO_IS_A_VALUE:
        assert getattr(cls(**{declaration.name: 0}), declaration.name) == 0
    else:
        with pytest.raises(OptionError):
            cls(**{declaration.name: 0})
        with pytest.raises(OptionError):
            cls(**{declaration.name: -1})


def test_named_values_replace_the_old_zeros():
    assert PlanOptions(mpp="level0").mpp == "level0"
    assert Options(tokens="model").tokens == "model"
    assert Options(batch_size="auto").batch_size is None  # its word for None
    with pytest.raises(OptionError, match=r"^mpp=0: .*or 'level0'$"):
        PlanOptions(mpp=0)
    with pytest.raises(OptionError, match=r"^tokens=0: .*or 'model'$"):
        Options(tokens=0)


def test_numpy_numbers_and_whole_floats_are_kept_as_the_declared_kind():
    options = PlanOptions(tile=np.int64(256), stride=128.0, mpp=np.float32(0.5))
    assert (options.tile, options.stride) == (256, 128) and type(options.tile) is int
    assert type(options.mpp) is float
    with pytest.raises(OptionError, match=r"^tile=True:"):  # a bool is not a number
        PlanOptions(tile=True)
    with pytest.raises(OptionError, match=r"^tile=224.5:"):
        PlanOptions(tile=224.5)


def test_words_text_paths_and_lists():
    assert PlanOptions(roi=Path("a.geojson"), exclude=["pen"]).exclude == ("pen",)
    with pytest.raises(OptionError, match=r"^filter='sharpness': must be 'contrast'$"):
        PlanOptions(filter="sharpness")
    with pytest.raises(OptionError, match=r"^device='tpu': must be 'auto', 'cpu', 'cuda'"):
        Options(device="tpu")
    assert Options(device="cuda:3").device == "cuda:3"
    with pytest.raises(OptionError, match=r"^roi=3: must be a path$"):
        PlanOptions(roi=3)
    with pytest.raises(OptionError, match=r"^detectors='pen,ink': choose among"):
        QCOptions(detectors=("pen", "ink"))


def test_a_record_is_checked_again_when_replaced():
    with pytest.raises(OptionError, match=r"^tile=0:"):
        replace(PlanOptions(), tile=0)


def test_declared_functions_check_their_parameters_at_the_call(tmp_path, slide_path):
    import tilestore
    from tests.conftest import CMU

    for kwargs, flag in (
        ({"mpp": 0}, "mpp=0"),
        ({"shard": 0}, "shard=0"),
        ({"chunk": 100}, "chunk=100"),
        ({"quality": 101}, "quality=101"),
        ({"workers": 0}, "workers=0"),
    ):
        with pytest.raises(OptionError, match=rf"^{flag}: must be"):
            tilestore.convert(slide_path(CMU), tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()  # refused before anything was made
