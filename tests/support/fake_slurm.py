"""A fake slurmrestd: just enough of SlurmClient for the Pusher, the gate, the hold jobs and
the sync, with a real ledger behind them. One ``update_node`` (slurmrestd's POST
node/{name}); a fake that must refuse, hold, count or follow an update overrides a hook
(``before_update``, ``store``, ``after_update``), never the signature."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, replace

from app.core.gres import gres_count
from app.core.slurm_models import JobAllocation, Listing, SlurmJob, SlurmNode
from app.slurm.errors import (
    SlurmUnavailable,
)
from app.slurm.push import Pusher

GIB = 1024**3
MIB = 2**20
LIMIT = 60.0  # seconds: generous, for a loaded machine; a pass never waits this long


def slurm_node(**changes: object) -> SlurmNode:
    """Node n1 of 16 CPUs and 32000 MB, idle, its k8s GRES at full capacity."""
    node = SlurmNode(
        "n1", 16, 32000, 0, 0, 0, "k8scpu:16,k8smemory:32000", "", frozenset({"IDLE"}), "", ""
    )  # fmt: skip
    return replace(node, **changes)  # type: ignore[arg-type]


def shown(gres: str) -> str:
    """A GRES string as Slurm shows it: a k8s count of 0 left out (app.core.counts,
    hides_usage), from ``gres`` and ``gres_used`` alike."""
    return ",".join(e for e in gres.split(",") if e and not re.fullmatch(r"k8s\w+:0", e))


@dataclass(frozen=True)
class NodeUpdate:
    """The fields of one node update; None leaves a field as it is. ``applied`` sets the
    first three; a fake that models drains reads ``state`` (DRAIN or RESUME) and ``reason``."""

    gres: str | None = None
    extra: str | None = None
    comment: str | None = None
    state: str | None = None
    reason: str | None = None

    def applied(self, node: SlurmNode) -> SlurmNode:
        fields = {"gres": self.gres, "extra": self.extra, "comment": self.comment}
        return replace(node, **{k: v for k, v in fields.items() if v is not None})


class FakeSlurm:
    """One node whose update takes a while. Its jobs are what the node's ``gres_used`` says
    (every job asks k8s GRES equal to its allocation); the job listing shows them as one
    job. ``updates`` lists the GRES of every update, in order."""

    user_name = "slurm"  # slurmrestd's X-SLURM-USER-NAME: the hold jobs' user

    def __init__(self, node: SlurmNode, latency: float = 0.01) -> None:
        self.node = node
        self.latency = latency
        self.updates: list[str] = []
        self._lock = threading.Lock()

    def get_node(self, name: str) -> SlurmNode:
        with self._lock:
            return replace(
                self.node, gres=shown(self.node.gres), gres_used=shown(self.node.gres_used)
            )

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob]:
        with self._lock:
            used, name = self.node.gres_used, self.node.name
        cpus, memory_mb = gres_count(used, "k8scpu"), gres_count(used, "k8smemory")
        allocation = JobAllocation(name, cpus, memory_mb, gres_count(used, "k8sgpu"))
        return Listing((SlurmJob("1", "jobs", "alice", frozenset({"RUNNING"}), (allocation,)),), 1)

    def update_node(
        self,
        name: str,
        *,
        gres: str | None = None,
        extra: str | None = None,
        comment: str | None = None,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        update = NodeUpdate(gres, extra, comment, state, reason)
        self.before_update(name, update)
        time.sleep(self.latency)
        with self._lock:
            if gres is not None:
                self.updates.append(gres)
            self.store(name, update)
        self.after_update(name, update)

    def before_update(self, name: str, update: NodeUpdate) -> None:
        """Before the update lands: raise to fail it (slurmrestd's answer), or wait."""

    def store(self, name: str, update: NodeUpdate) -> None:
        """Land the update (the fake's lock held)."""
        self.node = update.applied(self.node)

    def after_update(self, name: str, update: NodeUpdate) -> None:
        """After the update landed (the lock released)."""


class HeldSlurm(FakeSlurm):
    """A FakeSlurm whose first call waits for ``release``: the push making it holds the
    node's slot, so the test can line every other push up behind it and they overlap
    whatever the scheduler does (a busy machine may otherwise run them one by one)."""

    def __init__(self, node: SlurmNode) -> None:
        super().__init__(node, latency=0)
        self.entered = threading.Event()
        self.release = threading.Event()

    def get_node(self, name: str) -> SlurmNode:
        self._hold()
        return super().get_node(name)

    def before_update(self, name: str, update: NodeUpdate) -> None:
        self._hold()

    def _hold(self) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(LIMIT), "the test never released the first push"


class FlakySlurm(FakeSlurm):
    """A FakeSlurm which can be switched off (every call: unreachable)."""

    def __init__(self, node: SlurmNode) -> None:
        super().__init__(node, latency=0)
        self.down = False

    def get_node(self, name: str) -> SlurmNode:
        if self.down:
            raise SlurmUnavailable(f"slurmrestd GET node/{name}: slurmrestd unreachable")
        return super().get_node(name)

    def before_update(self, name: str, update: NodeUpdate) -> None:
        if self.down:
            raise SlurmUnavailable(f"slurmrestd POST node/{name}: slurmrestd unreachable")


class UnchangedSlurm(FlakySlurm):
    """Listings answer "unchanged since update_time" (None, HTTP 304) after the first."""

    def get_nodes(self, update_time: int | None = None) -> Listing[SlurmNode] | None:
        if self.down:
            raise SlurmUnavailable("slurmrestd GET nodes/: unreachable")
        return None if update_time else Listing((self.get_node("n1"),), 1)

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob] | None:
        if self.down:
            raise SlurmUnavailable("slurmrestd GET jobs/: unreachable")
        return None if update_time else Listing((), 1)


class TwoNodeSlurm(FakeSlurm):
    """Nodes n1, n2 and their jobs; listings are counted, and can be held up mid-read
    (``hold_listing``) to reproduce a listing that began before a hint."""

    def __init__(self) -> None:
        super().__init__(slurm_node(), latency=0)
        self.nodes = {n: slurm_node(name=n) for n in ("n1", "n2")}
        self.jobs: dict[str, SlurmJob] = {}
        self.listings = 0
        self.node_reads = 0
        self.ctld_started = 1000
        self.hold_listing = threading.Event()
        self.hold_listing.set()
        self._listed_jobs: tuple[SlurmJob, ...] = ()

    def get_nodes(self, update_time: int | None = None) -> Listing[SlurmNode]:
        self.listings += 1
        # The listing's moment, answered once let go.
        nodes, self._listed_jobs = tuple(self.nodes.values()), tuple(self.jobs.values())
        self.hold_listing.wait(10)
        return Listing(nodes, self.listings)

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob]:
        return Listing(self._listed_jobs, self.listings)

    def get_node(self, name: str) -> SlurmNode:
        self.node_reads += 1
        return self.nodes[name]

    def store(self, name: str, update: NodeUpdate) -> None:
        self.nodes[name] = update.applied(self.nodes[name])

    def get_job(self, job_id: str) -> SlurmJob | None:
        return self.jobs.get(job_id)

    def started_at(self) -> int:
        return self.ctld_started


def queued(pusher: Pusher, node: str) -> int:
    """How many pushes to ``node`` have been asked for: a peek at the pusher's private
    slot, the one place that says a thread has reached ``push`` and is waiting."""
    slot = pusher._slots.get(node)
    return 0 if slot is None else slot.requested


# slurmrestd's JSON, for a client on httpx.MockTransport: the OpenAPI paths of the
# versions it serves, and node n1.
OPENAPI = {"paths": {f"/slurm/v0.0.{n}/nodes/": {} for n in (40, 41, 42, 46)}}

NODE = {
    "name": "n1", "cpus": 16, "real_memory": 32000, "alloc_cpus": 2, "alloc_memory": 100,
    "gres": "k8scpu:16,k8smemory:32000", "gres_used": "k8scpu:0", "state": ["MIXED"],
    "extra": "", "specialized_memory": 0, "reason": "",
}  # fmt: skip
