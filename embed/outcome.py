"""How a run ended, as a process's exit status: one rule for `tilestore embed` (one process,
a task of a SLURM array, on Dask) and for a script around `embed_cohort`
(`sys.exit(report.exit_code)`), so a job scheduler's FAILED means the same everywhere.

  0  every store given is complete: embedded now, or before (skipped)
  2  nothing was done: every store failed or was refused (each named on stderr), as a
     command refused before any work (a bad flag, a missing file) exits 2
  3  some stores are complete and some failed, each named on stderr and in the report:
     rerunning the same command redoes only the failed ones

(2 for a run that did nothing keeps the house's rule that bad input exits 2: a single slide
refused for its pixel size is bad input, not a partial run.)
"""

from __future__ import annotations

DONE, FAILED, SOME_FAILED = 0, 2, 3


def exit_code(done: int, failed: int) -> int:
    """The exit status of a run: `done` stores complete, `failed` that failed or were
    refused (with a slide encoder asked for, a store whose slide vector failed is failed)."""
    if not failed:
        return DONE
    return SOME_FAILED if done else FAILED
