"""`tilestore crossval`, `train` and `predict`: models trained on a labelled cohort's stored
features, tested per fold, applied to new stores and explained inside them
(`tilestore.learn`). The training options are `LearnOptions`' flags; every refusal (a
model that does not exist, a run folder that exists, what the cohort refuses) is one line
and exit 2 before training starts."""

from __future__ import annotations

from pathlib import Path

import typer

from tilestore.cli.console import out
from tilestore.cli.flags import From, with_flags, written
from tilestore.learn import LearnOptions
from tilestore.options import store_changed, store_read
from tilestore.progress import to_stderr

CLINICAL = typer.Argument(..., help="The clinical table (CSV, TSV, Parquet, Excel).")
STORES = typer.Argument(..., help="The stores (or glob patterns) with the model's embeddings.")
MODEL = typer.Option(..., "--model", help="The embeddings' model (as given to `tilestore embed`).")
TARGET = typer.Option(None, "--target", help="A label column (repeat for several).")
KIND = typer.Option("classification", help="classification, regression or survival.")
PATIENT = typer.Option("PATIENT", help="The patient column of the tables.")
SLIDES = typer.Option(None, help="A slide table linking slides (stores) to patients.")
SLIDE_COLUMN = typer.Option("FILENAME", help="The slide table's slide column.")
PATIENT_FROM = typer.Option(
    None, help="Without a slide table: 'tcga' (a barcode's first 12 characters) or a regex."
)
TIME = typer.Option(None, help="Survival: the time column.")
EVENT = typer.Option(None, help="Survival: the event column (0/1).")
PLAN = typer.Option(None, help="The plan whose embeddings are read (default: the only one).")
SCALE = typer.Option(None, help="Keep the stores at this scale (e.g. 0.5mpp-224px).")
SLIDE_ENCODER = typer.Option(
    None,
    help="Learn from this slide encoder's stored vector, one per slide, instead of the tiles "
    "(with --arch linear).",
)
OUT = typer.Option(
    ..., "--out", help="The run folder (must not exist).", parser=written("--out"), metavar="<path>"
)
OVERWRITE = typer.Option(False, help="Replace a run folder that exists.")


def _cohort(
    clinical,
    stores,
    model,
    target,
    kind,
    patient,
    slides,
    slide_column,
    patient_from,
    time,
    event,
    plan,
    scale,
    slide_encoder,
):
    from tilestore.learn import build_cohort

    cohort = build_cohort(
        clinical,
        [str(store_read(s)) for s in stores],  # a URL kept whole
        model,
        targets=tuple(target or ()),
        kind=kind,
        patient=patient,
        slides=slides,
        slide_column=slide_column,
        patient_from=patient_from,
        time=time,
        event=event,
        plan=plan,
        scale=scale,
        slide_encoder=slide_encoder,
    )
    out.print(f"cohort: {cohort.summary()}", highlight=False)
    return cohort


def _said(result) -> None:
    for name, m in result.metrics.items():
        out.print(f"{name}: {m.value:.3f} [{m.low:.3f}, {m.high:.3f}]", highlight=False)
    out.print(f"run: {result.run_dir}/", highlight=False)


@with_flags
def crossval(
    clinical: Path = CLINICAL,
    stores: list[str] = STORES,
    model: str = MODEL,
    out_dir: Path = OUT,
    target: list[str] | None = TARGET,
    kind: str = KIND,
    patient: str = PATIENT,
    slides: Path | None = SLIDES,
    slide_column: str = SLIDE_COLUMN,
    patient_from: str | None = PATIENT_FROM,
    time: str | None = TIME,
    event: str | None = EVENT,
    plan: str | None = PLAN,
    scale: str | None = SCALE,
    slide_encoder: str | None = SLIDE_ENCODER,
    folds: int = typer.Option(5, min=2, help="Folds (patient-grouped, stratified)."),
    splits: Path | None = typer.Option(
        None, help="Splits from a file (a run's splits.json, or STAMP's)."
    ),
    resume: bool = typer.Option(False, help="Finish the run in --out (its unfinished folds)."),
    overwrite: bool = OVERWRITE,
    options: LearnOptions = From(LearnOptions),
) -> None:
    """Cross-validate a model on a labelled cohort: a model per fold, tested on its held-out
    patients; metrics with bootstrap intervals, predictions, weights, a report."""
    import tilestore.learn as learn

    learn.check_run_dir(out_dir, resume=resume, overwrite=overwrite)
    cohort = _cohort(
        clinical, stores, model, target, kind, patient, slides, slide_column, patient_from,
        time, event, plan, scale, slide_encoder,
    )  # fmt: skip
    made = (
        learn.read_splits(splits, cohort, seed=options.seed)
        if splits
        else learn.make_splits(cohort, folds, seed=options.seed)
    )
    result = learn.crossval(
        cohort, made, options, out_dir, resume=resume, overwrite=overwrite, progress=to_stderr
    )
    _said(result)


@with_flags
def train(
    clinical: Path = CLINICAL,
    stores: list[str] = STORES,
    model: str = MODEL,
    out_dir: Path = OUT,
    target: list[str] | None = TARGET,
    kind: str = KIND,
    patient: str = PATIENT,
    slides: Path | None = SLIDES,
    slide_column: str = SLIDE_COLUMN,
    patient_from: str | None = PATIENT_FROM,
    time: str | None = TIME,
    event: str | None = EVENT,
    plan: str | None = PLAN,
    scale: str | None = SCALE,
    slide_encoder: str | None = SLIDE_ENCODER,
    valid: float = typer.Option(0.2, min=0.05, max=0.5, help="Share held for early stopping."),
    overwrite: bool = OVERWRITE,
    options: LearnOptions = From(LearnOptions),
) -> None:
    """Train one model on the whole cohort (a share held out for early stopping), for
    `tilestore predict` on new stores."""
    import tilestore.learn as learn

    learn.check_run_dir(out_dir, overwrite=overwrite)
    cohort = _cohort(
        clinical, stores, model, target, kind, patient, slides, slide_column, patient_from,
        time, event, plan, scale, slide_encoder,
    )  # fmt: skip
    _said(
        learn.train(cohort, options, out_dir, valid=valid, overwrite=overwrite, progress=to_stderr)
    )


def predict(
    run: Path = typer.Argument(..., help="A finished run folder (crossval or train)."),
    stores: list[str] = STORES,
    fold: int | None = typer.Option(None, help="One fold's model (default: the folds' mean)."),
    device: str | None = typer.Option(None, help="cuda, cuda:N or cpu (default: the GPU if any)."),
    output: Path | None = typer.Option(
        None,
        help="The predictions' table (.csv or .parquet).",
        parser=written("--output"),
        metavar="<path>",
    ),
    explain: bool = typer.Option(
        False, help="Also write each tile's attention and contribution into the stores."
    ),
    name: str | None = typer.Option(
        None, help="The scores' name in the stores (default: the run folder's)."
    ),
    overwrite: bool = typer.Option(
        False, help="With --explain: replace a set of that name made by another run."
    ),
) -> None:
    """Apply a run's models to new stores: a prediction per slide; with --explain, per-tile
    scores in each store (`<name>:attention`, `<name>:<output>`: `tilestore view`,
    `tilestore export heatmap --column ...`)."""
    import tilestore.learn as learn

    # --explain writes each tile's scores into the stores: here (a URL refused in one line)
    paths = [str(store_changed(s, "tilestore predict --explain") if explain else store_read(s))
             for s in stores]  # fmt: skip
    written = None
    if explain:  # first: its refusals (a set of that name from another run) before any output
        written = learn.explain(
            run, paths, name=name, fold=fold, device=device, overwrite=overwrite
        )
    table = learn.predict(run, paths, fold=fold, device=device)
    if output is not None:
        (table.to_parquet if output.suffix == ".parquet" else table.to_csv)(output, index=False)
    out.print(table.drop(columns=["store"]).to_string(index=False), highlight=False)
    if written is not None:
        out.print(
            f"tile scores: {len(written)} store(s), {written[0] if written else ''}",
            highlight=False,
        )
