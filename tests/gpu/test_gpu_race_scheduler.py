"""Issue 33, item 5: GPU pods through the real kube-scheduler race GPU jobs, end to end.

Pods ask for one GPU of gpu-1 (Slurm's n3) through a ResourceClaim; the nodeledger
kube-scheduler (the chart's configuration, with placeholder pods and without) allocates a
device with the DRA allocator and the extender's bind holds it in Slurm by a hold job
before the pod is bound. Meanwhile
``--gres=gpu:1`` jobs come and go on n3, and two standing jobs hold devices 0 and 1 for the
whole race. A sampler compares, in one read of Slurm's jobs, the devices of the pods bound
throughout it with the devices of the running jobs: a device in both is shared, in either
variant a failure.

``taints``: the service keeps a DeviceTaintRule on every device a job holds, so the allocator
never gives a pod the standing jobs' devices; a pod can only be refused in a churning job's
window between its start and its taint landing. ``untainted`` is the broken variant (the
feature off): lowest first, the allocator gives pods the standing jobs' devices, and they
wait for as long as those jobs run. It must keep failing (a strict xfail, for that reason
only): the waits are what the taints remove.
"""

from __future__ import annotations

import contextlib
import random
import re
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as kube_client

from tests.support.gpu import (
    OURS,
    RESOURCE,
    SCHEDULER,
    SLURM_NODE,
    DraNode,
    Going,
    GpuService,
    SharedGpu,
    gpu_claim,
    gpu_pod,
    gpu_service,
    running_gpus,
    skip_without_device_taints,
)
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.kube, pytest.mark.slow]

SECONDS = 20.0  # of racing per run, then until contested
PODS_IN_FLIGHT = 2
# Churning GPU jobs kept submitted at once: one, so that beside the two standing jobs a
# device is always left for the pods. Two kept both free devices busy: a pod refused for
# room waits in kube-scheduler's unschedulable queue, and under load the race could end
# with too few pods bound to prove anything.
JOBS_QUEUED = 1
STANDING = (0, 1)  # devices the standing jobs hold throughout
JOB_NAME = "gpu-race-e2e"


class WaitedForJobDevice(AssertionError):
    """A pod was given a device a running job had: it waits for the job to end."""


@dataclass
class Race:
    taints: bool
    standing: set[str] = field(default_factory=set)  # the standing jobs' ids
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[str, int] = field(default_factory=dict)  # pod bound, not yet deleted -> device
    pods: list[str] = field(default_factory=list)
    bound_after: list[float] = field(default_factory=list)  # create -> bound, seconds
    unbound: int = 0  # pods never bound before the race ended
    given_standing: list[str] = field(default_factory=list)  # pod: the job's device it got
    jobs: set[str] = field(default_factory=set)
    samples: int = 0
    shared: list[str] = field(default_factory=list)

    def bound(self) -> dict[str, int]:
        with self.lock:
            return dict(self.live)

    def contested(self) -> bool:
        """Pods were bound and jobs ran beside them, sampled; untainted, until a pod was
        given a standing job's device (which it then waits for)."""
        with self.lock:
            if not self.taints:
                return bool(self.given_standing)
            return len(self.bound_after) >= 5 and len(self.jobs) >= 5 and self.samples >= 30


class Pods:
    """Claim pods scheduled by the nodeledger profile, through the Python client (a kubectl
    process per call would cost the race its pace)."""

    def __init__(self, dra: DraNode) -> None:
        self.core = kube_client.CoreV1Api(dra.api)
        self.custom = kube_client.CustomObjectsApi(dra.api)

    def create(self, name: str) -> None:
        self.custom.create_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", gpu_claim(name)
        )
        pod = gpu_pod(name, name)
        pod["spec"]["schedulerName"] = SCHEDULER
        self.core.create_namespaced_pod("default", pod)

    def node(self, name: str) -> str | None:
        found: str | None = self.core.read_namespaced_pod(name, "default").spec.node_name
        return found

    def allocated(self, name: str) -> list[int]:
        """The indices of the devices allocated to the pod's claim (gpuN), [] before."""
        claim = self.custom.get_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", name
        )
        allocation = claim.get("status", {}).get("allocation") or {}
        results = allocation.get("devices", {}).get("results", [])
        return [int(r["device"].removeprefix("gpu")) for r in results]

    def delete(self, name: str) -> None:
        """Gone at once (no kubelet confirms a graceful deletion); the claim too, its
        finalizer dropped (no controller manager runs here), so its device is free again."""
        with contextlib.suppress(kube_client.ApiException):
            self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        with contextlib.suppress(kube_client.ApiException):
            self.custom.patch_namespaced_custom_object(
                *RESOURCE, "default", "resourceclaims", name, {"metadata": {"finalizers": None}}
            )
            self.custom.delete_namespaced_custom_object(
                *RESOURCE, "default", "resourceclaims", name
            )


def scheduler_sees_the_taints(pods: Pods) -> None:
    """A probe pod is given a device past the standing jobs' ones: the scheduler's allocator
    has both rules (lowest first, it skips only the devices it sees tainted)."""

    def probe() -> bool:
        name = f"gpu-probe-{uuid.uuid4().hex[:8]}"
        pods.create(name)
        try:
            [device] = wait_until(lambda: pods.allocated(name), 60, 0.05, what=f"claim {name}")
        finally:
            pods.delete(name)
        return device not in STANDING

    wait_until(probe, 60, 0.5, what="the scheduler allocating past the tainted devices")


def run_pods(race: Race, pods: Pods, seed: int, going: Going) -> None:
    rng = random.Random(seed)
    while going():
        name = f"gpu-race-{uuid.uuid4().hex[:8]}"
        created = time.perf_counter()
        pods.create(name)
        with race.lock:
            race.pods.append(name)
        devices: list[int] = []
        node: str | None = None
        while going() and node is None:
            if not devices and set(devices := pods.allocated(name)) & set(STANDING):
                with race.lock:
                    race.given_standing.append(f"{name}: gpu{devices[0]}")
            node = pods.node(name)
            time.sleep(0.05)
        if node is not None:
            [device] = devices or pods.allocated(name)  # allocated before it is bound
            with race.lock:
                race.bound_after.append(time.perf_counter() - created)
                race.live[name] = device
            time.sleep(rng.uniform(0.3, 1.2))
            with race.lock:
                del race.live[name]  # its containers stopped before it is deleted
        else:
            with race.lock:
                race.unbound += 1
        pods.delete(name)


def run_jobs(race: Race, slurm: SlurmCluster, seed: int, going: Going) -> None:
    rng = random.Random(seed)
    while going():
        queued = set(slurm.run("squeue", "-h", "-n", JOB_NAME, "-o", "%i").split())
        if len(queued - race.standing) < JOBS_QUEUED:
            job = slurm.sbatch("-J", JOB_NAME, "-w", SLURM_NODE, "-c", "1", "--mem=100",
                               "--gres=gpu:1", "--wrap", f"sleep {rng.choice([1, 2])}")  # fmt: skip
            with race.lock:
                race.jobs.add(job)
        time.sleep(0.1)


def sample(race: Race, slurm: SlurmCluster, going: Going) -> None:
    while going():
        before = race.bound()
        jobs, _ = running_gpus(slurm, JOB_NAME)  # the pods' hold jobs apart
        after = race.bound()
        held = {pod: d for pod, d in before.items() if after.get(pod) == d}  # throughout
        for job, indices in jobs.items():
            race.shared.extend(
                f"gpu{device}: pod {pod} and job {job}"
                for pod, device in held.items()
                if device in indices
            )
        with race.lock:
            race.samples += 1
        time.sleep(0.02)


REFUSED_DEVICES = re.compile(r"GPU devices (\[[\d, ]*\]|gpu\d+(?:, gpu\d+)*)")


def refusals(pods: Pods, names: set[str]) -> dict[str, set[int]]:
    """The race's pods whose bind was refused for a GPU device, with those devices (from
    the scheduler's events, as `kubectl describe pod` shows them)."""
    refused: dict[str, set[int]] = {}
    for event in pods.core.list_namespaced_event("default").items:
        if event.involved_object.name not in names:
            continue
        for found in REFUSED_DEVICES.finditer(event.message or ""):
            devices = {int(d) for d in re.findall(r"\d+", found.group(1))}
            refused.setdefault(event.involved_object.name, set()).update(devices)
    return refused


@pytest.fixture(params=[
    pytest.param((True, False), id="taints"),
    # The chart's default scheduler configuration: placeholder pods, the extender binds.
    pytest.param((True, True), id="taints-placeholders"),
    pytest.param((False, False), id="untainted", marks=pytest.mark.xfail(
        strict=True, raises=WaitedForJobDevice,
        reason="without taints pods are given the jobs' devices (the broken variant)")),
])  # fmt: skip
def racing(
    request: pytest.FixtureRequest,
    dra_node: DraNode,
    slurm: SlurmCluster,
    sqlite_url: str,
    tmp_path: Path,
) -> Iterator[tuple[GpuService, bool]]:
    taints, placeholders = request.param
    skip_without_device_taints(dra_node)
    kube = dra_node.kube
    kube.delete("devicetaintrules", labels=OURS)
    setting = {"NODELEDGER_KUBE_GPU_DEVICE_TAINTS": str(taints).lower()}
    try:
        with gpu_service(GpuService, dra_node, slurm, sqlite_url, tmp_path,
                         name="gpu-race-e2e", scheduler=True, placeholders=placeholders,
                         **setting) as found:  # fmt: skip
            yield found, taints
    finally:
        slurm.run("scancel", "-n", JOB_NAME, check=False)
        kube.delete("devicetaintrules", labels=OURS)


def test_gpu_pods_through_the_scheduler_and_jobs_never_share_a_device(
    racing: tuple[GpuService, bool],
) -> None:
    service, taints = racing
    slurm, dra = service.slurm, service.dra
    pods = Pods(dra)
    race = Race(taints)
    for device in STANDING:
        job = slurm.sbatch("-J", JOB_NAME, "-w", SLURM_NODE, "-c", "1", "--mem=100",
                           f"--gres=gpu:g{device}:1", "--wrap", "sleep 900")  # fmt: skip
        race.standing.add(job)

    def standing() -> bool:
        return all(slurm.job_state(job) == "RUNNING" for job in race.standing)

    wait_until(standing, 60, what=f"the standing jobs {sorted(race.standing)} running")
    if taints:
        scheduler_sees_the_taints(pods)

    going = Going(race, SECONDS, limit=SECONDS * 8)
    work: list[Callable[[], None]] = [
        *(lambda i=i: run_pods(race, pods, seed=i, going=going) for i in range(PODS_IN_FLIGHT)),
        lambda: run_jobs(race, slurm, seed=99, going=going),
        lambda: sample(race, slurm, going),
    ]
    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        for done in [pool.submit(step) for step in work]:
            done.result()
    slurm.scancel(*race.jobs, *race.standing)
    wait_until(lambda: not holdings(service), 60, what="every pod's holding released")

    refused = refusals(pods, set(race.pods))
    churn = sum(1 for devices in refused.values() if not devices <= set(STANDING))
    times = sorted(race.bound_after) or [float("nan")]
    summary = (
        f"Slurm {slurm.release}, Kubernetes {dra.kube.version}, taints "
        f"{'on' if taints else 'off'}: {len(race.pods)} pods, {len(race.bound_after)} bound "
        f"(create to bound p50 {statistics.median(times) * 1000:.0f} ms, p99 "
        f"{times[min(len(times) - 1, int(len(times) * 0.99))] * 1000:.0f} ms), "
        f"{race.unbound} still waiting at the end; {len(refused)} refused at a bind for a "
        f"device ({churn} for another than the standing jobs': a churning job's before its "
        f"taint landed, or a released pod's hold not yet ended), {len(race.given_standing)} "
        f"given a standing job's device; {len(race.jobs)} GPU jobs, {race.samples} samples"
    )
    print(f"gpu race through kube-scheduler: {summary}")
    if race.shared:
        raise SharedGpu(f"{len(race.shared)} shared samples, e.g. {race.shared[:3]}; {summary}")
    if race.given_standing:
        raise WaitedForJobDevice(f"{race.given_standing[:3]}; {summary}")
    assert race.contested(), summary


def holdings(service: GpuService) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = httpx.get(
        f"{service.url}/v1/holdings", params={"holder_kind": "pod"}, timeout=30
    ).json()
    return rows
