"""How a run ended, as a process's exit status: one rule for `tilestore embed` (one process,
a task of a SLURM array, on Dask) and for a script around `embed_cohort`
(`sys.exit(report.exit_code)`), so a job scheduler's FAILED means the same everywhere.

  0  every store given is complete: embedded now, or before (skipped)
  2  some store failed or was refused, each named on stderr and in the report; the others
     are complete, and rerunning the same command redoes only what failed
  3  nothing was done: every store failed while being embedded (the model, the GPU or the
     node, not one slide, is the likely cause)

A command refused before any work (a bad flag, a missing file) exits 2 as every command does.
"""

from __future__ import annotations

DONE, SOME_FAILED, NOTHING_DONE = 0, 2, 3


def exit_code(done: int, failed: int, refused: int = 0) -> int:
    """The exit status of a run: `done` stores complete, `failed` that failed while being
    embedded, `refused` that were refused before (their input)."""
    if not failed and not refused:
        return DONE
    if failed and not done and not refused:
        return NOTHING_DONE
    return SOME_FAILED
