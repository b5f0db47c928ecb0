"""Issue 33: Slurm's GPU devices are visible to Kubernetes, on real parts.

A Slurm job holding gpu-1's device 0 (Slurm's n3, ``--gres=gpu:g0:1``) gets a
DeviceTaintRule (resource.k8s.io/v1, NoSchedule) naming it, from `nodeledger serve`'s
leader; the real kube-scheduler then allocates a pod's claim another device (its allocator
skips a device a rule taints), and the rule goes when the job ends. Kubernetes 1.37 on: an
earlier release does not serve the v1 API, and the test is skipped saying so.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gpu import (
    DRIVER,
    NODE,
    OURS,
    SLURM_NODE,
    DraNode,
    Tainting,
    gpu_service,
    job_gpus,
    skip_without_device_taints,
)
from tests.support.service import running_service
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.kube]


@pytest.fixture
def tainting(
    dra_node: DraNode, slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> Iterator[Tainting]:
    skip_without_device_taints(dra_node)
    kube = dra_node.kube
    kube.delete("devicetaintrules", labels=OURS)
    try:
        with gpu_service(Tainting, dra_node, slurm, sqlite_url, tmp_path,
                         name="device-taints") as found:  # fmt: skip
            yield found
    finally:
        kube.delete("devicetaintrules", labels=OURS)


def test_a_device_a_slurm_job_holds_is_tainted_and_no_pod_is_allocated_it(
    tainting: Tainting,
) -> None:
    slurm, dra = tainting.slurm, tainting.dra
    rule = "nodeledger-gpu-1-g0"
    job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:g0:1",
                       "--wrap", "sleep 600")  # fmt: skip
    try:
        wait_until(lambda: slurm.job_state(job) == "RUNNING", 30, what=f"job {job} running")
        running = time.perf_counter()
        assert job_gpus(slurm, job)[1] == {0}
        found = wait_until(lambda: tainting.rules().get(rule), 30, 0.05, what=f"rule {rule}")
        tainted_after = time.perf_counter() - running
        assert found["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": NODE, "device": "gpu0"}
        taint = found["spec"]["taint"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            "nodeledger.io/slurm-job",
            job,
            "NoSchedule",
        )
        assert set(tainting.rules()) == {rule}  # device 0 only
        shown = {"device": 0, "holderKind": "slurm_job", "holderID": job, "holder": job,
                 "deviceTaintRule": rule}  # fmt: skip
        wait_until(lambda: tainting.gpus() == [shown], 30, 0.05, what="status.gpus")

        # kube-scheduler allocates lowest first: gpu0, were it not tainted.
        pod = f"gpu-tainted-{uuid.uuid4().hex[:8]}"
        allocation, latency = dra.allocate(pod)
        [result] = allocation["devices"]["results"]
        assert result["device"] != "gpu0", allocation
        assert dra.kube.wait_bound(pod) == NODE
    finally:
        cancelled = time.perf_counter()
        slurm.scancel(job)
    wait_until(lambda: rule not in tainting.rules(), 30, 0.05, what=f"rule {rule} deleted")
    untainted_after = time.perf_counter() - cancelled
    wait_until(lambda: tainting.gpus() == [], 30, 0.05, what="status.gpus emptied")
    print(
        f"device taints: Slurm {slurm.release}, Kubernetes {dra.kube.version}: job {job} on "
        f"gpu0, rule {rule} visible {tainted_after * 1000:.0f} ms after the job was seen "
        f"RUNNING; pod {pod} got {result['device']} ({latency * 1000:.0f} ms); rule gone "
        f"{untainted_after * 1000:.0f} ms after scancel"
    )


def test_turned_off_the_rules_of_ours_go(
    tainting: Tainting, sqlite_url: str, tmp_path: Path
) -> None:
    slurm = tainting.slurm
    job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:g1:1",
                       "--wrap", "sleep 600")  # fmt: skip
    try:
        wait_until(lambda: "nodeledger-gpu-1-g1" in tainting.rules(), 30, 0.05, what="rule")
        tainting.service.process.terminate()  # it releases its lease: the next leads at once
        tainting.service.process.wait(timeout=30)
        env = {**tainting.env, "NODELEDGER_KUBE_GPU_DEVICE_TAINTS": "false"}
        with running_service(sqlite_url, tmp_path, env=env, name="taints-off"):
            wait_until(lambda: not tainting.rules(), 30, 0.05, what="our rules deleted")
    finally:
        with contextlib.suppress(Exception):
            slurm.scancel(job)


def test_a_slurmctld_restart_keeps_the_taint_of_a_running_job(tainting: Tainting) -> None:
    """While slurmctld restarts the listings fail: a failed read is not "no jobs", so the
    rule stays throughout, and goes within a listing of the job's end afterwards."""
    slurm = tainting.slurm
    rule = "nodeledger-gpu-1-g2"
    job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:g2:1",
                       "--wrap", "sleep 600")  # fmt: skip
    try:
        wait_until(lambda: rule in tainting.rules(), 30, 0.05, what=f"rule {rule}")
        seen: list[bool] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.append(rule in tainting.rules())
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.perf_counter()
        slurm.restart_ctld()
        wait_until(lambda: slurm.job_state(job) == "RUNNING", 60, what=f"job {job} running")
        restarted_after = time.perf_counter() - started
        time.sleep(3)  # listings again
        done.set()
        watcher.join(5)
        assert seen, "the rules were never read"
        assert all(seen), f"rule {rule} gone during the restart ({seen.count(False)} looks)"
        value = tainting.rules()[rule]["spec"]["taint"]["value"]
        assert value == job
    finally:
        slurm.scancel(job)
    cancelled = time.perf_counter()
    wait_until(lambda: rule not in tainting.rules(), 30, 0.05, what=f"rule {rule} deleted")
    print(
        f"device taints, slurmctld restart: Slurm {slurm.release}: restart took "
        f"{restarted_after:.1f} s, rule {rule} present in all {len(seen)} looks; gone "
        f"{(time.perf_counter() - cancelled) * 1000:.0f} ms after scancel"
    )
