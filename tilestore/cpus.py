"""How many CPUs this process may run on.

On HPC nodes a job gets a share of the cores (SLURM's cgroup/affinity, taskset); sizing
thread and process pools by os.cpu_count() there oversubscribes the job's cores.
"""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs in this process's affinity mask (os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1
