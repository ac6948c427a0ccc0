"""What every `tilestore` command prints with: consoles, a progress bar, the library's
messages put in terms of flags."""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tilestore import OutputError
from tilestore.options import Opt
from tilestore.progress import AtLeast, LogLines

out = Console()
err = Console(stderr=True)


class progress_bar:
    """A rich progress bar on stderr for one job; yields (progress, task id). Where stderr
    is not a terminal (a SLURM log, nohup), a line every `every` seconds instead, and one at
    the end of a job long enough to have had them: done, rate and time left, so a log shows
    the run is alive."""

    def __init__(self, label: str, every: float = 30.0) -> None:
        self.every = every
        self.progress = _Bar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self.label = label

    def __enter__(self):
        if not err.is_terminal:
            self.lines = LogLines(self.label, self.every)
            return self.lines, 0
        self.lines = None
        self.progress.start()
        return self.progress, self.progress.add_task(self.label, total=None)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()
        if self.lines is not None and exc[0] is None:
            self.lines.finish()


class _Bar(Progress):
    """rich's Progress, whose total stays open ("474/?", no time left) while the library
    says it is still growing (`AtLeast`: stores not planned yet)."""

    def update(self, task_id, *, total=None, **changes) -> None:
        super().update(task_id, total=None if isinstance(total, AtLeast) else total, **changes)


def line_printer(progress: Progress | LogLines) -> Callable[[str], None]:
    """The printer of the library's lines of what it does (compiling, waiting for a compile)
    as it works: above a live progress bar, or straight into the log (flushed: a SLURM log
    shows them as they happen, not at exit)."""
    if isinstance(progress, LogLines):
        return progress.say
    return lambda line: progress.console.print(line, highlight=False, markup=False)


def text_table(*columns: str) -> Table:
    """A borderless table of these columns, folding long cells."""
    result = Table(box=None, pad_edge=False)
    for column in columns:
        result.add_column(column, overflow="fold")
    return result


class kept_on_interrupt:
    """What the command running kept, in words, for the line `tilestore.cli.main` says when
    a signal stops it (None: its general words): `say(text)` as the command unwinds."""

    said: str | None = None

    @classmethod
    def say(cls, text: str) -> None:
        cls.said = text


def output_file(path: Path | None, folder: bool = False) -> Path | None:
    """An output's place made ready before the command's work (its folder made; a folder
    itself with `folder`), or refused in one line: a run never fails at its last step for a
    missing or read-only folder."""
    if path is None:
        return None
    where = path if folder else path.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{path}: cannot make the folder {where} ({exc.strerror})") from None
    if not os.access(where, os.W_OK):
        raise OutputError(f"{path}: the folder {where} is not writable")
    if not folder and path.is_dir():
        raise OutputError(f"{path}: a folder, not a file to write")
    return path


def human_size(n: float) -> str:
    """Bytes as people read them: 2.5 MB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


# A command's own options, not the library's: how it prints
AsJson = Annotated[bool, Opt("Print JSON instead of a table.", flag="json")]

Flags = dict[str, tuple[str, str | None]]  # parameter -> (its flag, its --no- flag)


def flags_of(*commands: Callable) -> Flags:
    """The flags of these typer command functions' parameters, as typer names them (a
    generated flag also under the library's name for it: `tilestore.cli.flags`)."""
    flags: Flags = {}
    for command in commands:
        for name, param in inspect.signature(command).parameters.items():
            info = param.default
            if not isinstance(info, typer.models.OptionInfo):
                continue
            decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
            on, _, off = decls[0].partition("/") if decls else ("", "", "")
            flag = on or "--" + name.replace("_", "-")
            switch = param.annotation in (bool, "bool") and not decls
            flags[name] = (flag, off or (f"--no-{flag[2:]}" if switch else None))
        for library_name, flag_name in getattr(command, "flag_aliases", {}).items():
            flags.setdefault(library_name, flags[flag_name])
    return flags


# name=value as the library writes it: 'text', <placeholder>, True/False, a number or a word
_SETTING = re.compile(r"\b([a-z][a-z0-9_]*)=('[^']*'|<[^>]*>|[^\s,;)]*)")


def as_flags(message: str, flags: Flags) -> str:
    """The library's message with its parameters as the command's flags: overwrite=True
    becomes --overwrite, decode='gpu' --decode gpu, mpp=<um/px> --mpp <um/px>."""

    def flag(match: re.Match) -> str:
        name, value = match.groups()
        if name not in flags:
            return match.group(0)
        on, off = flags[name]
        if value in ("True", ""):
            return on
        if value == "False":
            return off or match.group(0)
        return f"{on} {value.strip(chr(39))}"

    return _SETTING.sub(flag, message)
