"""`tilestore status`: how far a cohort's embeddings of one model are (a SLURM array's result,
say), and the `tilestore embed` command that finishes the rest. Read only: it writes
nothing in the stores and takes no lock.

Exit codes: 0 every store complete; 1 work left (partial, running or not started: a store
without any embeddings group too); 2 bad input (several models' embeddings and no --model
among them), or a store damaged or of another plan (a run cannot finish those without
--overwrite), or blocked (a file where its folder must be).

A running store's row names its lock's holder, last heartbeat and path; where a job is
known dead, the command printed under "if that job is dead" takes its lock over at once
(`--break-lock`; unasked, the next run takes over a lock silent for 5 min)."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from tilestore.cli.console import AsJson, as_flags, flags_of, output_file
from tilestore.cli.embed import embed
from tilestore.cli.flags import with_flags
from tilestore.embeddings import (
    STATES,
    TAKEN_OVER,
    AskedEncoder,
    AskedModel,
    AskedPlan,
    Finish,
    GroupStatus,
    breaking_runs,
    embeddings_status,
    finishing_runs,
    only_model,
)
from tilestore.options import Opt, is_url, named, store_read

# the command's own: where it writes the stores left
Todo = Annotated[
    Path | None,
    Opt("Write the stores left to this file, one a line, for the command printed."),
]


@with_flags
def status(
    stores: list[str] = typer.Argument(
        ..., help="Stores (.ome.zarr) of a cohort: paths, or URLs (s3://, gs://, https://)."
    ),
    model: AskedModel = None,
    plan: AskedPlan = None,
    slide_encoder: AskedEncoder = None,
    todo: Todo = None,
    as_json: AsJson = False,
) -> None:
    """Say how far each store's embeddings are (complete, partial, running, damaged, not
    started, blocked) and print the `tilestore embed` command that finishes the rest; exit 0
    when every store is complete, 1 with work left, 2 for a store damaged, of another plan
    or blocked."""
    output_file(todo)
    stores = [store_read(store) for store in stores]  # a URL kept whole
    if model is None:
        model = only_model([embeddings_status(store) for store in stores])
        if model is None:  # nothing started anywhere: every store is work left
            _none_started(stores, as_json)
            raise typer.Exit(1)
        if len(stores) > 1:  # one store: its row names it
            print(f"model: {model} (the stores' only one; --model to ask for another)",
                  file=sys.stderr)  # fmt: skip
    found = [  # each store as it is shown (a URL without its user, password or query)
        (named(s), _resumed(g, model))
        for s in stores
        for g in embeddings_status(s, model, plan).groups
    ]
    runs = finishing_runs(found, model, plan, slide_encoder)
    left = [store for run in runs for store in run.stores]
    # embedding writes into a store: one in object storage is copied here first, so no
    # command nor --todo line names it (the local stores beside it in a run keep theirs)
    remote = [store for store in left if is_url(store)]
    runs = [replace(run, stores=tuple(s for s in run.stores if not is_url(s))) for run in runs]
    runs = [run for run in runs if run.stores]
    if todo:
        todo.write_text("".join(f"{store}\n" for run in runs for store in run.stores))
    commands = [_command(run, todo if len(runs) == 1 else None) for run in runs]
    breaking = [_command(run, None) for run in breaking_runs(found, model, plan, slide_encoder)]
    counts = {state: sum(g.state == state for _, g in found) for state in STATES}
    if as_json:
        rows = [_row(store, group, slide_encoder) for store, group in found]
        print(json.dumps({"model": model, "plan": plan, "slide_encoder": slide_encoder,
                          "stores": rows, "counts": counts, "left": left,
                          "commands": commands, "if_dead": breaking,
                          "in_object_storage": remote}, indent=2))  # fmt: skip
    else:
        _print(found, counts, slide_encoder, commands, todo, len(left) - len(remote), breaking)
        if remote:
            print(
                f"{len(remote)} store{'s' * (len(remote) != 1)} left in object storage: "
                "embedding writes into a store, and one there is only read where it is: copy "
                "it here (aws s3 sync, gcloud storage rsync), embed the copy, copy it back"
            )
    if any(g.blocked for _, g in found):
        raise typer.Exit(2)
    if left or counts["running"]:
        raise typer.Exit(1)


def _resumed(group: GroupStatus, model: str) -> GroupStatus:
    """The group with any_scale among what a run must repeat, where its tiles are not the
    model's input (`scale_mismatch`, the run's own judgement: it refuses them without)."""
    from tilestore.embed import get_model, scale_mismatch

    if not group.run or group.tile is None:
        return group
    if scale_mismatch(group.mpp, group.tile, get_model(model)) is None:
        return group
    return replace(group, run={**group.run, "any_scale": True})


def _row(store: str, group: GroupStatus, encoder: str | None) -> dict[str, Any]:
    vector = group.has_vector(encoder) if encoder else None
    return {"store": store, **group.to_json(), "slide_vector": vector,
            "left": group.left(encoder)}  # fmt: skip


def _none_started(stores: list[Path], as_json: bool) -> None:
    """No store holds embeddings of any model: each is not started, and the model to
    start them with is the user's to name."""
    ask = "name the model with --model for the command that embeds them"
    if as_json:
        rows = [{"store": str(s), "state": "not started", "left": True} for s in stores]
        print(json.dumps({"model": None, "stores": rows, "left": [str(s) for s in stores],
                          "commands": [], "note": ask}, indent=2))  # fmt: skip
        return
    for store in stores:
        print(f"{store}  not started")
    n = len(stores)
    print(f"{n} store{'s' * (n != 1)}: {n} not started (no embeddings of any model); {ask}")


def _print(found, counts, encoder, commands, todo, left: int, breaking: list[str]) -> None:
    rows = [("store", "plan", "state", "tiles", "slide vector", "note")]
    for store, group in found:
        tiles = f"{group.tiles_done:,}/{group.tiles:,}" if group.tiles else "-"
        note = as_flags(group.note, flags_of(embed))
        rows.append((store, group.plan or "-", group.state, tiles, _vector(group, encoder), note))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:  # plain lines, never folded: a cohort's paths are long, logs are grepped
        cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
        print("  ".join([*cells, row[5]]).rstrip())
    said = ", ".join(f"{n} {state}" for state, n in counts.items())
    if encoder:
        missing = sum(1 for _, g in found if g.state == "complete" and not g.has_vector(encoder))
        said += f"; {missing} complete without a current {encoder} slide vector"
    stores = len({store for store, _ in found})
    groups = f" ({len(found)} groups: one a plan)" if len(found) != stores else ""
    print(f"{stores} stores{groups}: {said}")  # plain print: the sum is one line
    if counts["running"]:
        print(
            f"{counts['running']} running: they finish on their own; ask again later "
            f"({TAKEN_OVER}); if that job is dead, now:"
        )
        for command in breaking:  # plain print: a command is never wrapped
            print(f"  {command}")
    if commands:
        into = f" (listed in {todo})" if todo else ""
        print(f"to finish the {left} store{'s' * (left != 1)} left{into}:")
        for command in commands:  # plain print: a command is never wrapped
            print(f"  {command}")
        if left > 20 and not todo:
            print(f"  (or --todo FILE: the {left} stores in a file, for embed $(cat FILE))")
    if todo:
        print(f"stores left: {todo}")


def _vector(group: GroupStatus, encoder: str | None) -> str:
    """yes/no for the encoder asked; else the encoders whose vectors the group holds."""
    if encoder:
        return "yes" if group.has_vector(encoder) else "no"
    shown = [v.encoder + ("" if v.state == "current" else f" ({v.state})")
             for v in group.slide_vectors]  # fmt: skip
    return ", ".join(shown) or "-"


def _command(run: Finish, todo: Path | None) -> str:
    """The `tilestore embed` command line of a run, its stores from `todo` where given."""
    flags = flags_of(embed)
    words = ["tilestore", "embed"]
    words += [f"$(cat {shlex.quote(str(todo))})"] if todo else map(shlex.quote, run.stores)
    for name, value in run.options.items():
        flag = flags[name][0]
        if value is True:
            words.append(flag)
        else:
            shown = ",".join(value) if isinstance(value, tuple) else str(value)
            words += [flag, shlex.quote(shown)]
    return " ".join(words)
