"""Learning from stored features: slide and patient models (MIL on bags of tile features,
linear heads on slide vectors) trained, cross-validated, deployed and explained inside the
stores.

>>> from tilestore.learn import build_cohort, make_splits, LearnOptions, crossval, explain
>>> cohort = build_cohort("clinical.csv", "stores/*.ome.zarr", "uni", targets="MSI")
>>> result = crossval(cohort, make_splits(cohort, 5), LearnOptions(model="abmil"), "runs/msi")
>>> explain("runs/msi", "stores/*.ome.zarr")      # <run>:attention columns in each store

A floor of its own, above `tilestore.exports`'s and below `tilestore.embed`'s: it reads
embeddings, format, reading, plan and analysis; never conversion, view, exports, embed or
the command. torch is imported inside the functions that train or run a model, so importing
this package or building a cohort never pays for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.learn.task": ("Task",),
        "tilestore.learn.cohort": ("Cohort", "CohortSlide", "build_cohort", "read_table"),
        "tilestore.learn.splits": ("Fold", "Splits", "make_splits", "read_splits", "write_splits"),
        "tilestore.learn.metrics": ("Metric", "evaluate"),
        "tilestore.learn.models": ("MODELS", "make_model"),
        "tilestore.learn.bags": ("Bags", "load_bags"),
        "tilestore.learn.options": ("LearnOptions",),
        "tilestore.learn.train": ("Fitted", "fit"),
        "tilestore.learn.run": ("RunResult", "check_run_dir", "crossval"),
    },
)
__all__ = sorted([*__all__, "explain", "predict", "train"])

# Three functions share their module's name (the plan's): importing a submodule binds it
# on the package, so these are bound here, first and for good (no torch: it loads inside).
import tilestore.learn.train  # noqa: E402  (the module first, then the function over it)
from tilestore.learn.explain import explain  # noqa: E402
from tilestore.learn.predict import predict  # noqa: E402
from tilestore.learn.run import train  # noqa: E402

if TYPE_CHECKING:
    from tilestore.learn.bags import Bags, load_bags
    from tilestore.learn.cohort import Cohort, CohortSlide, build_cohort, read_table
    from tilestore.learn.explain import explain
    from tilestore.learn.metrics import Metric, evaluate
    from tilestore.learn.models import MODELS, make_model
    from tilestore.learn.options import LearnOptions
    from tilestore.learn.predict import predict
    from tilestore.learn.run import RunResult, check_run_dir, crossval, train
    from tilestore.learn.splits import Fold, Splits, make_splits, read_splits, write_splits
    from tilestore.learn.task import Task
    from tilestore.learn.train import Fitted, fit
