"""The Dask flags `embed` and `qc` share, declared once: `--cluster` (start one here) or
`--scheduler` (join one), and the client they make."""

from __future__ import annotations

import typer

from tilestore import OptionError

CLUSTER = typer.Option(
    None, help="Run on Dask: local-cuda (a worker per GPU) or local (CPU processes)."
)
SCHEDULER = typer.Option(
    None, help="Run on an existing Dask cluster at this address (e.g. SLURMCluster's)."
)


def dask_client(cluster: str | None, scheduler: str | None, workers: int | None):
    """The client of the cluster started (`cluster`) or joined (`scheduler`), and the CPUs
    each worker may use (a local cluster's workers share this machine's cores; a
    scheduler's have their own: None); refused where both are given."""
    if cluster and scheduler:
        raise OptionError("--cluster starts a cluster, --scheduler joins one: give one")
    from distributed import Client

    from tilestore.embed import cpu_share, local_cluster

    client = Client(scheduler) if scheduler else local_cluster(cluster, workers)
    return client, cpu_share(len(client.nthreads())) if cluster else None
