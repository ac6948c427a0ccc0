"""Learning from stored features: labelled cohorts, folds, models, metrics, reports.

>>> cohort = build_cohort("clinical.csv", "stores/", "uni", targets="MSI", slides="slides.csv")
>>> cohort.summary()                 # every row of the tables accounted for, in one line
>>> splits = make_splits(cohort, k=5, seed=0)   # patient-grouped, stratified
>>> evaluate(cohort.task, y_true, y_pred)       # metrics with bootstrap 95% intervals
>>> model = make_model("abmil", in_dim=1024, outputs=2)   # the registry of models (`MODELS`)
>>> result = crossval(cohort, splits, LearnOptions(model="abmil"), "runs/msi")  # a run folder
>>> predict("runs/msi", "new/*.ome.zarr")                # the folds' ensemble on new stores
>>> explain("runs/msi", "stores/*.ome.zarr")             # <run>:attention columns in each store

Each name loads its module on first use: `import tilestore.learn` and building a cohort never
import torch.

May import `tilestore.embeddings`, `format`, `reading`, `plan`, `analysis`, `errors`,
`options`, `progress`, `faces`; torch (lazily), scikit-learn, pandas, matplotlib,
safetensors. Never conversion, view, exports, embed or cli.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.learn.task": ("KINDS", "Kind", "Task"),
        "tilestore.learn.cohort": (
            "Cohort",
            "CohortSlide",
            "Row",
            "as_recipe",
            "build_cohort",
            "read_table",
        ),
        "tilestore.learn.splits": (
            "Fold",
            "Splits",
            "make_splits",
            "read_splits",
            "read_stamp_splits",
            "write_splits",
        ),
        "tilestore.learn.metrics": ("Metric", "c_index", "evaluate"),
        "tilestore.learn.plots": ("plot_km", "plot_pr", "plot_roc"),
        "tilestore.learn.page": ("prediction_frame", "read_metrics", "write_metrics", "write_page"),
        "tilestore.learn.losses": ("loss_for",),
        "tilestore.learn.models": ("MODELS", "ModelSpec", "make_model"),
        "tilestore.learn.models.base": ("BagOutput",),
        "tilestore.learn.bags": ("Bags", "load_bags"),
        "tilestore.learn.options": ("LearnOptions",),
        "tilestore.learn.training": ("Fitted", "fit"),
        "tilestore.learn.run": ("RunResult", "check_run_dir", "crossval", "train"),
        "tilestore.learn.prediction": ("predict",),
        "tilestore.learn.explanation": ("explain",),
        "tilestore.errors": ("LabelError", "LabelTableError", "RunError"),
    },
)

if TYPE_CHECKING:
    from tilestore.errors import LabelError, LabelTableError, RunError
    from tilestore.learn.bags import Bags, load_bags
    from tilestore.learn.cohort import (
        Cohort,
        CohortSlide,
        Row,
        as_recipe,
        build_cohort,
        read_table,
    )
    from tilestore.learn.explanation import explain
    from tilestore.learn.losses import loss_for
    from tilestore.learn.metrics import Metric, c_index, evaluate
    from tilestore.learn.models import MODELS, ModelSpec, make_model
    from tilestore.learn.models.base import BagOutput
    from tilestore.learn.options import LearnOptions
    from tilestore.learn.page import prediction_frame, read_metrics, write_metrics, write_page
    from tilestore.learn.plots import plot_km, plot_pr, plot_roc
    from tilestore.learn.prediction import predict
    from tilestore.learn.run import RunResult, check_run_dir, crossval, train
    from tilestore.learn.splits import (
        Fold,
        Splits,
        make_splits,
        read_splits,
        read_stamp_splits,
        write_splits,
    )
    from tilestore.learn.task import KINDS, Kind, Task
    from tilestore.learn.training import Fitted, fit
