"""What every `tilestore` command prints with: consoles and a progress bar."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

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
