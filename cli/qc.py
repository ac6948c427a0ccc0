"""`tilestore qc`: artefact maps for stores, here or on Dask, and the cohort report."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tilestore.cli.console import as_flags, flags_of, out, output_file
from tilestore.cli.console import progress_bar as _progress
from tilestore.cli.dask import CLUSTER, SCHEDULER, dask_client
from tilestore.cli.flags import From, with_flags, written
from tilestore.options import Workers, store_changed
from tilestore.qc import FLAG_FRACTION, FlagFraction, QCOptions


@with_flags
def qc(
    stores: list[str] = typer.Argument(..., help="Stores made by `tilestore convert`."),
    options: QCOptions = From(QCOptions, only=("mpp", "detectors", "device", "fine_blur")),
    flag_fraction: FlagFraction = FLAG_FRACTION,
    preview: Path | None = typer.Option(
        None,
        help="Folder for a PNG per slide: the artefacts over its thumbnail.",
        parser=written("--preview"),
        metavar="<path>",
    ),
    report: Path | None = typer.Option(
        None,
        help="Folder for the cohort report: qc.csv, qc.parquet, qc.html.",
        parser=written("--report"),
        metavar="<path>",
    ),
    cluster: str | None = CLUSTER,
    scheduler: str | None = SCHEDULER,
    workers: Workers = None,
) -> None:
    """Find pen ink, bubbles, folds, dark or washed-out regions, blur and stain outliers;
    store them as labels/qc and a summary in each store; optionally a cohort report."""
    from tilestore.qc import qc_cohort, write_report

    stores = [store_changed(s, "tilestore qc") for s in stores]  # a URL: one line, first
    output_file(preview, folder=True)
    output_file(report, folder=True)
    client, threads = None, None
    if cluster or scheduler:
        client, threads = dask_client(cluster, scheduler, workers)
    failed, unjudged = [], []

    def line(result) -> None:
        if result.error:
            failed.append(result)
            print(f"tilestore: error: {as_flags(result.error, flags_of(qc))}", file=sys.stderr)
            return
        if result.not_judged:  # a fact about the slide, not a failure of the run
            unjudged.append(result)
            out.print(f"{result.store}: not judged: {result.not_judged}", highlight=False)
            return
        s = result.summary
        shares = (
            ", ".join(f"{k} {v:.1%}" for k, v in s["fractions"].items() if v >= 0.001)
            or "no artefacts"
        )
        if s.get("not_judged"):
            shares += f"; not judged: {', '.join(s['not_judged'])}"
        flags = f"  FLAGGED: {', '.join(s['flags'])}" if s["flags"] else ""
        area = f"{s['tissue_mm2']:.1f} mm² tissue" if s["tissue_mm2"] is not None else "tissue"
        out.print(
            f"{result.store}: {area}; {shares} ({s['seconds']:.1f} s, {s['device']}){flags}",
            highlight=False,
        )

    try:
        with _progress("QC") as (progress, task):
            progress.update(task, total=len(stores))

            def step(result) -> None:
                progress.update(task, advance=1)
                line(result)

            results, wall = qc_cohort(
                [str(s) for s in stores],
                options,
                flag_fraction=flag_fraction,
                preview=preview,
                client=client,
                threads=threads,
                progress=step,
            )
    finally:
        if client is not None:
            if cluster:
                client.cluster.close()
            client.close()
    done = len(results) - len(failed) - len(unjudged)
    aside = f" ({len(unjudged)} not judged)" if unjudged else ""
    out.print(f"{done} of {len(results)} slides judged in {wall:.1f} s{aside}", highlight=False)
    if preview:
        out.print(f"previews: {preview}/")
    if report:
        paths = write_report(results, report)
        out.print(f"report: {paths['html']} (table: {paths['csv'].name}, {paths['parquet'].name})")
    if failed:
        raise typer.Exit(2)
