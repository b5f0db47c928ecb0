"""Pushes to one node are serialized and coalesced, and always carry the latest ledger
state (a fake slurmrestd with latency, a real SQLite ledger)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from app.admission.service import AdmissionRequest, Admissions
from app.core.caps import KubeCaps
from app.core.ledger_errors import AdmissionRejected
from app.core.plan import health_reason, slurm_snapshot
from app.core.records import Holder, HolderKind, NodeSpec, SnapshotEntry
from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, LedgerHolds, SlurmJob
from app.ledger.service import Ledger
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from tests.support.fake_slurm import GIB, LIMIT, FakeSlurm, HeldSlurm, queued, slurm_node
from tests.support.realenv import wait_until


def test_a_burst_of_admissions_costs_few_pushes_and_ends_exact(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    fake = HeldSlurm(slurm_node())
    pusher = Pusher(fake, ledger)  # type: ignore[arg-type]
    admissions = Admissions(ledger, SlurmGate(pusher, KubeCaps(), holds=HoldJobs(fake)))  # type: ignore[arg-type]

    def admit(i: int) -> None:
        holder = Holder(HolderKind.POD, f"uid-{i}", f"ns/p{i}")
        admissions.admit(AdmissionRequest("n1", holder, Resources(500, GIB)))

    with ThreadPoolExecutor(max_workers=16) as pool:
        done = [pool.submit(admit, 0)]
        assert fake.entered.wait(LIMIT), "the first admission never reached Slurm"
        # The burst: every other admission holds in the ledger and waits behind that push.
        done += [pool.submit(admit, i) for i in range(1, 16)]
        wait_until(lambda: queued(pusher, "n1") == 16, LIMIT, what="16 pushes asked for")
        fake.release.set()
        for future in done:
            future.result()
    assert fake.node.gres == "k8scpu:8,k8smemory:15616"  # 16 x 500m = 8 CPUs, 16 GiB
    # The push in flight, then one that read all 16 holds; the other 14 rode on it.
    assert len(fake.updates) == 2, fake.updates


def test_overlap_with_a_job_that_started_meanwhile_is_rejected_and_undone(
    ledger: Ledger,
) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    # A job the ledger has not seen yet: Slurm counted its GRES, the node's own alloc_cpus
    # is stale (0).
    fake = FakeSlurm(slurm_node(gres_used="k8scpu:14,k8smemory:100"))
    job = SlurmJob("41", "sim", "bob", frozenset({"RUNNING"}), (JobAllocation("n1", 14, 100, 0),))
    pusher = Pusher(fake, ledger)  # type: ignore[arg-type]
    holds = HoldJobs(fake)  # type: ignore[arg-type]
    gate = SlurmGate(pusher, KubeCaps(), holds=holds, jobs_on=lambda node: [job])
    admissions = Admissions(ledger, gate)
    with pytest.raises(
        AdmissionRejected, match=r"Slurm already holds it.*14 of 16 CPUs.*jobs 41 \(sim\)"
    ):
        admissions.admit(
            AdmissionRequest("n1", Holder(HolderKind.POD, "u1", "ns/p"), Resources(4000, GIB))
        )
    assert ledger.list_holdings() == []
    assert fake.node.gres == "k8scpu:16,k8smemory:32000"  # counts raised back


def test_snapshot_attributes_jobs_and_keeps_the_unattributed_rest() -> None:
    node = slurm_node(alloc_cpus=6, alloc_memory_mb=3000, gres="gpu:4", gres_used="gpu:1")
    job = SlurmJob(
        "7", "train", "alice", frozenset({"RUNNING"}), (JobAllocation("n1", 4, 2000, 1),)
    )
    snapshot = slurm_snapshot(node, [job], LedgerHolds("slurm"))
    assert snapshot["7"] == SnapshotEntry("train (alice)", Resources(4000, 2000 * 2**20, 1))
    assert snapshot["node:n1"].resources == Resources(2000, 1000 * 2**20, 0)
    fits = replace(node, alloc_cpus=4, alloc_memory_mb=2000)
    assert "node:n1" not in slurm_snapshot(fits, [job], LedgerHolds("slurm"))


def test_health_reason_names_the_state() -> None:
    assert health_reason(slurm_node(), "n1") is None
    assert health_reason(slurm_node(states=frozenset({"MIXED"})), "n1") is None
    drained = slurm_node(states=frozenset({"IDLE", "DRAIN"}), reason="disk")
    assert health_reason(drained, "n1") == "Slurm node n1 is DRAIN+IDLE: disk"
    assert health_reason(None, "n9") == "Slurm has no node 'n9'"
