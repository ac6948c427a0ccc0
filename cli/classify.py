"""`tilestore classify`: zero-shot class scores of stored tiles from an image-text model's
text tower, written into the stores as per-tile columns (heatmaps in `tilestore view`)."""

from __future__ import annotations

from pathlib import Path

import typer

from tilestore.cli.console import out
from tilestore.cli.flags import From, with_flags
from tilestore.embed import ZeroShotOptions
from tilestore.options import store_changed


@with_flags
def classify(
    stores: list[str] = typer.Argument(..., help="Stores embedded with --model."),
    model: str = typer.Option(
        ...,
        help="An image-text model whose features the stores hold (`tilestore models list`: "
        "a zero-shot text tower).",
    ),
    prompts: Path = typer.Option(
        ...,
        help="The classes and their prompts: JSON or YAML in CONCH's form: 'classnames' "
        "(each class, a list of its names), optional 'templates' (sentences holding "
        "CLASSNAME).",
    ),
    options: ZeroShotOptions = From(ZeroShotOptions),
) -> None:
    """Zero-shot: score every stored tile against each class's prompts (the model's own text
    tower, from the same checkpoint), write the probabilities beside the features
    (columns NAME:<class> and NAME, shown as heatmaps by `tilestore view`) and print each
    slide's score (the mean of its tiles' probabilities)."""
    from tilestore.embed import classify as score
    from tilestore.embed import read_prompts

    # the scores are written beside the features: stores here (a URL refused in one line)
    stores = [store_changed(store, "tilestore classify") for store in stores]
    read = read_prompts(prompts)  # checked before a store is read or the model loads
    for done in score([str(s) for s in stores], model, read, options):
        shares = ", ".join(f"{c} {p:.3f}" for c, p in done.slide.items())
        out.print(
            f"{done.store}: {done.path} ({done.tiles} tiles); slide: {shares}; top {done.top}",
            highlight=False,
            soft_wrap=True,
        )
