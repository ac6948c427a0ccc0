"""Which Dask workers a cohort had (`tilestore.embed.membership`), against a scheduler and a
cluster played by hand: losses named with what they ran, replacements asked of a
SpecCluster's plan, never of a nanny's worker or a cluster the client has none of."""

from __future__ import annotations

from distributed import Nanny
from distributed.deploy.spec import SpecCluster

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
        self.scaled = []

    def new_worker_spec(self):
        return {f"job-{len(self.worker_spec) + len(self.scaled)}": {"cls": "W"}}


class Client:
    def __init__(self, workers, cluster=None):
        self.workers, self.running, self.cluster = dict(workers), {}, cluster
        self.down = False

    def scheduler_info(self, n_workers=-1):
        if self.down:
            raise OSError("connection refused")
        return {"workers": {a: {"name": n} for a, n in self.workers.items()}}

    def processing(self):
        return self.running


def test_a_lost_job_is_named_with_its_tasks_and_replaced(monkeypatch):
    cluster = Cluster(["job-0", "job-1"])
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    said = []
    members = Membership(client, say=said.append, every=3600)
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
    assert event.replacement == "a new worker asked of the cluster"
    assert said[-1].startswith("worker job-1 (tcp://b) lost after ")
    assert "2 task(s) it was running go to others" in said[-1] and said[-1].endswith("1 alive")
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
    members = Membership(client, every=3600)
    del client.workers["tcp://a"]
    members.look()
    assert members.lost[0].replacement == "its nanny restarts it" and not cluster.loop.calls
    members.stop()


def test_without_a_cluster_object_nothing_can_be_asked():
    client = Client({"tcp://a": "w0", "tcp://b": "w1"})  # Client("tcp://scheduler:8786")
    members = Membership(client, every=3600)
    del client.workers["tcp://a"]
    members.look()
    assert members.lost[0].replacement.startswith("none: the client has no cluster object")
    members.stop()


def test_replace_false_asks_nothing():
    cluster = Cluster(["job-0", "job-1"])
    client = Client({"tcp://a": "job-0", "tcp://b": "job-1"}, cluster)
    members = Membership(client, replace=False, every=3600)
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


def test_respec_drops_the_dead_entry_and_scales_back(monkeypatch):
    cluster = Cluster(["job-0", "job-1", "job-2"])
    scaled = []
    monkeypatch.setattr(SpecCluster, "scale", lambda self, n: scaled.append(n))
    _respec(cluster, "job-1")
    assert sorted(cluster.worker_spec) == ["job-0", "job-2"] and scaled == [3]
