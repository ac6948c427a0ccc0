"""How a run ended, as a process's exit status and as its report's `outcome`: one table for
`tilestore embed` (one process, a task of a SLURM array, on Dask) and for a script around
`embed_cohort` (`sys.exit(report.exit_code)`), so a job scheduler's FAILED means the same
everywhere. The constants below are the table's; tests hold each code with a real run.

  0    complete: every store given is complete, embedded now or before (skipped); a share
       with no store of its own (`--shard K/N` of an array larger than the cohort) too
  3    partial: some stores are complete and some failed, each named on stderr and in the
       report: rerunning the same command redoes only the failed ones
  2    nothing done: every store failed or was refused, each named on stderr
  2    damaged input: a bad flag, a missing file, a report folder that cannot be written,
       refused in one line before any work; a damaged store alone is refused so too
  130  interrupted: by Ctrl-C (SIGINT), after a line saying which stores were finished and
       how many tiles of the others were kept; the same command carries on from there
  143  interrupted: by SIGTERM (what SLURM sends at a time limit, a preemption or a
       requeue, and `kill`'s default), said and kept as for 130: 128 + the signal
  138  interrupted: by SIGUSR1, "the time limit is near" (`#SBATCH --signal=B:USR1@60`,
       passed on by the batch script): the batch in flight finished, the shard it was
       filling written, then stopped; a batch script requeues itself on it

(Damaged input and a run that did nothing share 2, the house's rule for bad input: a single
slide refused for its pixel size is bad input, not a partial run. Each is named on stderr,
and the report, where one was asked for, says which.)
"""

from __future__ import annotations

import signal

DONE, FAILED, SOME_FAILED = 0, 2, 3
BAD_INPUT = 2  # refused before any work: as a run whose every store was refused
INTERRUPTED = 128  # + the signal: 130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1
SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")  # those that stop a run (`tilestore.cli.main`)

# the report's word for each code (interrupted: any code from INTERRUPTED on)
OUTCOMES = {DONE: "complete", SOME_FAILED: "partial", FAILED: "nothing done"}


def exit_code(done: int, failed: int) -> int:
    """The exit status of a run: `done` stores complete, `failed` that failed or were
    refused (with a slide encoder asked for, a store whose slide vector failed is failed)."""
    if not failed:
        return DONE
    return SOME_FAILED if done else FAILED


def interrupted_code(name: str) -> int:
    """The exit status of a run stopped by the signal of this name (SIGINT: 130)."""
    return INTERRUPTED + signal.Signals[name]


def outcome(code: int) -> str:
    """The report's word for an exit status: complete, partial, nothing done, interrupted."""
    return "interrupted" if code > INTERRUPTED else OUTCOMES[code]
