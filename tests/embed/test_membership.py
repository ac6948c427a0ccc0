"""Which Dask workers a cohort had (`tilestore.embed.membership`): against a scheduler and a
cluster played by hand (losses named with what they ran; replacements asked of a
SpecCluster's plan once a lost name has not come back, never of a nanny's worker or a
cluster the client has none of), and against real ones (a LocalCluster whose client
refreshes its cache, a SpecCluster of jobs, jobs whose nanny restarts their worker)."""

from __future__ import annotations

import contextlib
import time
from typing import ClassVar

import dask
import pytest
from distributed import Client as DaskClient
from distributed import LocalCluster, Nanny, Scheduler
from distributed.deploy.spec import ProcessInterface, SpecCluster

from tilestore.embed.membership import Membership, _respec


class Loop:
    def __init__(self):
        self.calls = []

    def add_callback(self, fn, *args):
        self.calls.append((fn, args))


class Cluster:
    """What Membership reads of a SpecCluster: its plan, its worker objects, its loop."""

    def __init__(self, names, worker=object):
        self.worker_spec = {n: {"cls": "W"} for n in names}
        self.workers = {n: worker.__new__(worker) for n in names}
        self.loop = Loop()
        self.status = "running"
        self._i = 0

    def _new_worker_name(self, worker_number):
        return f"job-{worker_number}"


class Client:
    def __init__(self, workers, cluster=None):
        self.workers, self.running, self.cluster = dict(workers), {}, cluster
        self.down = False

        self.scheduler = self

    def identity(self, n_workers=0):
        if self.down:
            raise OSError("connection refused")
        return {"workers": {a: {"name": n} for a, n in self.workers.items()}}

    def sync(self, method, **kwargs):
        return method(**kwargs)

    def processing(self):
        return self.running


def test_a_lost_job_is_named_with_its_tasks_and_replaced(monkeypatch):
    cluster = Cluster(["job-0", "job-1"])
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    said = []
    now = [100.0]  # a fake clock: the grace passes when the test says so
    members = Membership(client, say=said.append, every=3600, grace=0.3, clock=lambda: now[0])
    client.running = {"tcp://a": ["slice-1"], "tcp://b": ["slice-2", "slice-3"]}
    members.look()
    del client.workers["tcp://b"]
    members.look()
    ((event),) = members.lost
    assert (event.name, event.address, event.running) == (
        "job-1",
        "tcp://b",
        ["slice-2", "slice-3"],
    )
    assert said[-1].startswith("worker job-1 (tcp://b) lost after 0 s")  # the fake clock's
    assert "2 task(s) it was running go to others" in said[-1] and said[-1].endswith("1 alive")
    assert "replacement: asked if it is not back within 0.3 s" in said[-1]
    assert event.replacement is None and not cluster.loop.calls  # its nanny may restart it
    now[0] = 100.25
    members.look()  # within the grace: still waiting for its name to come back
    assert event.replacement is None and not cluster.loop.calls
    now[0] = 100.5
    members.look()
    assert event.replacement == "a new worker asked of the cluster"
    assert said[-1] == "worker job-1 (tcp://b): replacement: a new worker asked of the cluster"
    ((fn, args),) = cluster.loop.calls  # run on the cluster's own thread
    scaled = []
    monkeypatch.setattr(SpecCluster, "scale", lambda self, n: scaled.append(n))
    fn(*args)
    assert "job-1" not in cluster.worker_spec and scaled == [2]  # as many as before
    client.workers["tcp://c"] = "job-2"  # the new job's worker
    members.look()
    assert [e.name for e in members.joined] == ["job-2"] and members.status() == (
        "2 worker(s) alive, 1 lost"
    )
    members.stop()


def test_a_nanny_restarts_its_worker_and_nothing_is_asked():
    cluster = Cluster(["0", "1"], worker=Nanny)
    client = Client({"tcp://a": "0", "tcp://b": "1"}, cluster)
    members = Membership(client, every=3600, grace=0)
    del client.workers["tcp://a"]
    members.look()
    assert members.lost[0].replacement == "its nanny restarts it" and not cluster.loop.calls
    members.stop()


def test_a_job_whose_worker_comes_back_under_its_name_is_left_alone():
    """A job's own nanny (dask-jobqueue's default) restarts its worker at a new address:
    the name is back within the grace, so the healthy job is neither dropped nor replaced."""
    cluster = Cluster(["job-0", "job-1"])
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    said = []
    members = Membership(client, say=said.append, every=3600, grace=3600)
    del client.workers["tcp://b"]
    members.look()
    client.workers["tcp://b2"] = "job-1"  # restarted in the same job
    members.look()
    (event,) = members.lost
    assert event.replacement == "none needed: its nanny restarted it" and not cluster.loop.calls
    assert said[-2] == "worker job-1 (tcp://b2) joined; 2 alive"
    assert said[-1] == "worker job-1 (tcp://b): replacement: none needed: its nanny restarted it"
    assert sorted(cluster.worker_spec) == ["job-0", "job-1"]
    members.stop()


def test_a_loss_the_cohort_outlives_by_less_than_the_grace_says_so():
    cluster = Cluster(["job-0", "job-1"])
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    members = Membership(client, every=3600, grace=3600)
    del client.workers["tcp://a"]
    members.look()
    members.stop()
    assert (
        members.lost[0].replacement == ("not asked: the cohort ended within 3600 s of the loss")
        and not cluster.loop.calls
    )


def test_without_a_cluster_object_nothing_can_be_asked():
    client = Client({"tcp://a": "w0", "tcp://b": "w1"})  # Client("tcp://scheduler:8786")
    members = Membership(client, every=3600, grace=0)
    del client.workers["tcp://a"]
    members.look()
    assert members.lost[0].replacement.startswith("none: the client has no cluster object")
    members.stop()


def test_a_cluster_that_does_not_number_workers_as_speccluster_is_not_touched():
    cluster = Cluster(["job-0", "job-1"])
    del cluster._i  # another cluster class, or a distributed that numbers otherwise
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    members = Membership(client, every=3600, grace=0)
    del client.workers["tcp://b"]
    members.look()
    assert members.lost[0].replacement.startswith("none: the cluster does not number")
    assert not cluster.loop.calls and sorted(cluster.worker_spec) == ["job-0", "job-1"]
    members.stop()


def test_replace_false_asks_nothing():
    cluster = Cluster(["job-0", "job-1"])
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    members = Membership(client, replace=False, every=3600, grace=0)
    del client.workers["tcp://a"]
    members.look()
    assert members.lost[0].replacement is None and not cluster.loop.calls
    members.stop()


def test_a_scheduler_out_of_reach_is_said_once():
    client = Client({"tcp://a": "w0"})
    said = []
    members = Membership(client, say=said.append, every=3600)
    client.down = True
    members._look_or_say()
    members._look_or_say()
    assert said == ["cannot ask the scheduler for its workers (connection refused); trying on"]
    client.down = False
    members.stop()


class Job(ProcessInterface):
    """A worker job that starts nothing: the cluster's record of what it submitted."""

    def __init__(self, scheduler=None, name=None, submitted=None):
        super().__init__()
        self.name, self.submitted = name, submitted

    async def start(self):
        self.submitted.append(self.name)
        await super().start()


class Jobs(SpecCluster):
    """Names its jobs as dask-jobqueue does (`SLURMCluster-0`, ...)."""

    def _new_worker_name(self, worker_number):
        return f"job-{worker_number}"


def _until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@contextlib.contextmanager
def _two_jobs():
    """A real SpecCluster of two jobs, up: (the cluster, the job names submitted, in order)."""
    submitted: list[str] = []
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    worker = {"cls": Job, "options": {"submitted": submitted}}
    with Jobs(workers={}, scheduler=scheduler, worker=worker) as cluster:
        cluster.scale(2)
        assert _until(lambda: len(submitted) == 2 and len(cluster.workers) == 2), submitted
        yield cluster, submitted


def test_a_lost_job_is_replaced_by_a_new_job_on_a_real_spec_cluster():
    """The replacement must not take the dead job's name: the cluster would take the entry
    for the dead job's object, still among its workers, and submit nothing (found under the
    one-node SLURM); under a new name the dead job is closed and a new one submitted."""
    with _two_jobs() as (cluster, submitted):
        dead = cluster.workers["job-1"]
        closed = []
        dead.close = lambda: closed.append("job-1") or ProcessInterface.close(dead)
        cluster.loop.add_callback(_respec, cluster, "job-1")  # as Membership asks it
        assert _until(lambda: len(submitted) == 3), submitted
        assert sorted(submitted[:2]) == ["job-0", "job-1"] and submitted[2] == "job-2"
        assert sorted(cluster.worker_spec) == ["job-0", "job-2"]
        assert _until(lambda: "job-1" not in cluster.workers) and closed == ["job-1"]  # scancel
        cluster.loop.add_callback(_respec, cluster, "job-0")
        assert _until(lambda: len(submitted) == 4), submitted
        assert sorted(cluster.worker_spec) == ["job-2", "job-3"]  # never a name still held


def test_no_worker_is_taken_for_lost_while_the_client_refreshes_its_cache():
    """The client's periodic refresh writes its scheduler-info cache without workers (every
    2 s; every 5 ms here): the looks must never read it (they took every worker for lost:
    15 of 300 reads of the cache were short here)."""
    refresh = {"distributed.client.scheduler-info-interval": "5ms"}
    with dask.config.set(refresh), LocalCluster(
        n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0"
    ) as cluster, DaskClient(cluster) as client:  # fmt: skip
        members = Membership(client, replace=False, every=3600)
        for _ in range(300):
            members.look()
        members.stop()
    assert not members.lost and len(members.alive) == 2


def test_a_lost_jobs_name_is_never_given_again_once_the_cluster_closed_it():
    """The cluster's lost-worker timeout may close the dead job (its object gone from the
    cluster's workers) before the replacement is asked: the new job still gets a new name,
    so that a later loss of it is never taken for the dead one's."""
    with _two_jobs() as (cluster, submitted):
        cluster.workers.pop("job-1")  # closed by the cluster's own timeout
        cluster.loop.add_callback(_respec, cluster, "job-1")
        assert _until(lambda: len(submitted) == 3), submitted
        assert submitted[2] == "job-2" and sorted(cluster.worker_spec) == ["job-0", "job-2"]


def test_a_grace_that_is_not_a_number_of_seconds_is_refused():
    client = Client({"tcp://a": "w0"})
    for grace in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"^grace=.*: seconds, 0 or more$"):
            Membership(client, every=3600, grace=grace)


class NannyJob(ProcessInterface):
    """A job running a Nanny, as dask-jobqueue's jobs do (nanny=True); `closed` records a
    job cancelled (scancel)."""

    closed: ClassVar[list[str]] = []

    def __init__(self, scheduler=None, name=None):
        super().__init__()
        self.scheduler, self.name = scheduler, name

    async def start(self):
        self.nanny = await Nanny(self.scheduler, name=self.name, nthreads=1)
        await super().start()

    async def close(self):
        NannyJob.closed.append(self.name)
        await self.nanny.close()
        await super().close()


def test_a_worker_restarted_by_its_jobs_nanny_keeps_its_job():
    """The worker of a healthy job restarted by the job's nanny (a memory limit, a crash):
    gone at its address, back under its name; the job is not cancelled, nothing replaces it
    (it was cancelled and replaced when a loss was acted on at once)."""
    NannyJob.closed = []
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    with Jobs(workers={}, scheduler=scheduler, worker={"cls": NannyJob}) as cluster, DaskClient(
        cluster
    ) as client:  # fmt: skip
        cluster.scale(2)
        client.wait_for_workers(2)
        # a grace far above a restart's seconds, even on a loaded CI machine
        members = Membership(client, every=0.1, grace=300)
        address = next(a for a, n in members.alive.items() if n == "job-1")
        client.restart_workers([address], timeout=300)
        assert _until(lambda: len(members.lost) == 1 and members.lost[0].replacement, 300)
        members.stop()
        assert members.lost[0].replacement == "none needed: its nanny restarted it"
        assert sorted(cluster.worker_spec) == ["job-0", "job-1"] and NannyJob.closed == []
        assert sorted(members.alive.values()) == ["job-0", "job-1"]
