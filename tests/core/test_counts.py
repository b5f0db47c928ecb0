"""Counts left to Slurm once Kubernetes has its share, and the overlap check (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.counts import (
    K8sCounts,
    SlurmUnits,
    current_counts,
    desired_counts,
    extra_with_holdings,
    gres_usage,
    hides_usage,
    slurm_overlap,
    slurm_usage,
)
from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, LedgerHolds, SlurmJob, SlurmNode

GIB = 1024**3


def node(
    gres: str = "k8scpu:16,k8smemory:32000",
    *,
    cpus: int = 16,
    memory: int = 32000,
    spec_memory: int = 0,
    alloc_cpus: int = 0,
    alloc_memory: int = 0,
    gres_used: str = "",
    extra: str = "",
) -> SlurmNode:
    return SlurmNode(
        "n1", cpus, memory, spec_memory, alloc_cpus, alloc_memory, gres, gres_used,
        frozenset({"IDLE"}), "", extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("held", "units"),
    [
        (Resources(0, 0, 0), SlurmUnits(0, 0, 0)),
        (Resources(1, 1, 0), SlurmUnits(1, 1, 0)),
        (Resources(1000, 1024**2, 1), SlurmUnits(1, 1, 1)),
        (Resources(1001, 1024**2 + 1, 2), SlurmUnits(2, 2, 2)),
        (Resources(1500, 2 * GIB, 0), SlurmUnits(2, 2048, 0)),
    ],
    ids=str,
)
def test_kubernetes_holdings_round_up_to_slurm_units(held: Resources, units: SlurmUnits) -> None:
    assert SlurmUnits.of(held) == units


def test_desired_counts_subtract_and_clamp() -> None:
    assert desired_counts(node(), SlurmUnits(2, 2048, 0)) == K8sCounts(14, 29952, None)
    assert desired_counts(node(), SlurmUnits(99, 99999, 0)) == K8sCounts(0, 0, None)
    gpu_node = node("k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:4")
    assert desired_counts(gpu_node, SlurmUnits(0, 0, 1)) == K8sCounts(16, 32000, 3)


def test_memory_left_excludes_specialized_memory() -> None:
    assert desired_counts(node(spec_memory=2000), SlurmUnits(0, 1000, 0)).k8smemory == 29000


@given(
    held=st.builds(SlurmUnits, st.integers(0, 64), st.integers(0, 70000), st.integers(0, 8)),
    cpus=st.integers(1, 32),
    memory=st.integers(1, 64000),
)
def test_counts_never_exceed_the_node_nor_go_negative(
    held: SlurmUnits, cpus: int, memory: int
) -> None:
    counts = desired_counts(node(cpus=cpus, memory=memory), held)
    assert 0 <= counts.k8scpu <= cpus
    assert counts.k8scpu + held.cpus >= cpus
    assert 0 <= counts.k8smemory <= memory
    assert counts.k8smemory + held.memory_mb >= memory


def test_current_counts_read_dropped_zeroes_as_zero() -> None:
    assert current_counts(node("k8smemory:100,gpu:4")) == K8sCounts(0, 100, 0)


def test_extra_json_keys_are_ours_alone() -> None:
    held = SlurmUnits(2, 100, 1)
    ours = '"nodeledger_k8scpu":2,"nodeledger_k8smemory":100,"nodeledger_k8sgpu":1'
    assert extra_with_holdings("", held) == "{" + ours + "}"
    assert extra_with_holdings('{"site": "a"}', held) == '{"site":"a",' + ours + "}"
    assert extra_with_holdings('{"rack":"row  7"}', held) == '{"rack":"row  7",' + ours + "}"
    assert extra_with_holdings("", SlurmUnits(0, 0, 0)) == ""
    assert extra_with_holdings("{" + ours + "}", SlurmUnits(0, 0, 0)) == ""
    assert extra_with_holdings('{"site":1,"nodeledger":1}', SlurmUnits(0, 0, 0)) == '{"site":1}'
    # Marked (jobs queue behind pods): the marker stays when nothing is held.
    assert extra_with_holdings("", SlurmUnits(0, 0, 0), marked=True) == '{"nodeledger":1}'
    assert extra_with_holdings("", held, marked=True) == '{"nodeledger":1,' + ours + "}"
    # The token of an earlier release becomes the JSON form.
    old = "nodeledger=k8scpu:9,k8smemory:1,k8sgpu:0"
    assert extra_with_holdings(old, held) == "{" + ours + "}"
    for extra in ("", '{"site":"a"}', old, "site=a"):
        for marked in (False, True):
            once = extra_with_holdings(extra, held, marked=marked)
            assert extra_with_holdings(once, held, marked=marked) == once


def test_extra_token_beside_a_sites_text_is_ours_alone() -> None:
    assert extra_with_holdings("site=a", SlurmUnits(2, 100, 1)) == (
        "site=a nodeledger=k8scpu:2,k8smemory:100,k8sgpu:1"
    )
    assert (
        extra_with_holdings("nodeledger=k8scpu:9,k8smemory:1,k8sgpu:0 b", SlurmUnits(0, 0, 0))
        == "b"
    )


def test_usage_is_slurms_gres_accounting_not_the_stale_node_figures() -> None:
    used = "k8scpu:6,k8smemory:3000,k8sgpu:1,gpu:1"
    stale = node(alloc_cpus=0, alloc_memory=0, gres="gpu:4", gres_used=used)
    assert gres_usage(stale) == SlurmUnits(6, 3000, 1)
    # Cancelled job: single-node reads keep alloc_cpus, gres_used is already 0.
    assert gres_usage(node(alloc_cpus=4, gres_used="k8scpu:0,k8smemory:0")) == SlurmUnits(0, 0, 0)
    assert gres_usage(node(gres="gpu:4", gres_used="k8sgpu:2,gpu:1")).gpus == 2


def test_a_hold_jobs_devices_are_not_usage() -> None:
    # A GPU hold job (issue 30) has its pod's device but no k8s GRES: the counts withhold the
    # pod already, and its device again would make every held pod an overlap.
    held = node(gres="gpu:4", gres_used="k8scpu:4,k8smemory:100,k8sgpu:1,gpu:2")
    assert gres_usage(held) == SlurmUnits(4, 100, 1)


def test_overlap_names_each_resource_slurm_already_uses() -> None:
    busy = node(gres="gpu:4")
    used = SlurmUnits(10, 1000, 3)
    assert slurm_overlap(busy, used, SlurmUnits(6, 31000, 1)) == []
    problems = slurm_overlap(busy, used, SlurmUnits(7, 31001, 2))
    assert [p.split(":")[0] for p in problems] == ["cpu", "memory", "gpu"]


def _job(
    job_id: str, node: str, cpus: int, *, state: str = "RUNNING", hold: bool = False
) -> SlurmJob:
    return SlurmJob(
        job_id,
        "nodeledger-hold" if hold else "wrap",
        "slurm" if hold else "alice",
        frozenset({state}),
        (JobAllocation(node, cpus, 500, 1), JobAllocation("n9", 8, 8000, 0)),
        comment="nodeledger-hold:uid" if hold else "",
    )


def test_a_count_of_zero_hides_its_use_and_the_jobs_tell_it() -> None:
    """Slurm leaves a GRES with a total of 0 out of gres_used too (26.05.3): the jobs listed
    after the read say what they use; hold jobs (pods) and ended jobs do not count."""
    shown = node("k8scpu:2,k8smemory:1000", gres_used="k8scpu:2,k8smemory:500")
    assert not hides_usage(shown)
    holds = LedgerHolds("slurm", frozenset({"2"}))  # job 2, the ledger's hold job
    assert slurm_usage(shown, [_job("1", "n1", 8)], holds) == SlurmUnits(2, 500, 0)
    hidden = node("k8smemory:1000", gres_used="k8smemory:500")
    assert hides_usage(hidden)
    jobs = [
        _job("1", "n1", 2),
        _job("2", "n1", 3, hold=True),
        _job("3", "n1", 4, state="COMPLETED"),
        _job("4", "n2", 5),
    ]
    assert slurm_usage(hidden, jobs, holds) == SlurmUnits(2, 500, 1)
    assert slurm_usage(hidden, [], holds) == SlurmUnits(0, 500, 0)
    gpus_hidden = node("k8scpu:16,k8smemory:1000,gpu:4", gres_used="k8scpu:0,k8smemory:0,gpu:1")
    assert hides_usage(gpus_hidden)  # k8sgpu 0 on a node with GPUs
