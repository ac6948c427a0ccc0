"""What every `tilestore` command prints with: consoles, a progress bar, the library's
messages put in terms of flags."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

out = Console()
err = Console(stderr=True)


class progress_bar:
    """A rich progress bar on stderr for one job; yields (progress, task id)."""

    def __init__(self, label: str) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self.label = label

    def __enter__(self):
        if err.is_terminal:
            self.progress.start()
        return self.progress, self.progress.add_task(self.label, total=None)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def text_table(*columns: str) -> Table:
    """A borderless table of these columns, folding long cells."""
    result = Table(box=None, pad_edge=False)
    for column in columns:
        result.add_column(column, overflow="fold")
    return result


def human_size(n: float) -> str:
    """Bytes as people read them: 2.5 MB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


Flags = dict[str, tuple[str, str | None]]  # parameter -> (its flag, its --no- flag)


def flags_of(*commands: Callable) -> Flags:
    """The flags of these typer command functions' parameters, as typer names them."""
    flags: Flags = {}
    for command in commands:
        for name, param in inspect.signature(command).parameters.items():
            info = param.default
            if not isinstance(info, typer.models.OptionInfo):
                continue
            decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
            flag = decls[0] if decls else "--" + name.replace("_", "-")
            negative = (
                None if decls or param.annotation not in (bool, "bool") else f"--no-{flag[2:]}"
            )
            flags[name] = (flag, negative)
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
