"""The chart installed for real: `helm install` of the service's own image into a cluster
whose nodes run pods (kubelet + containerd), the chart's scheduler as a pod calling the
extender over TLS, pods through their whole life, both sides end to end from inside the
cluster, `helm upgrade` and `helm uninstall`.

The tests run in file order on one release (module fixture), once per Slurm release the
suite runs (the newest first; a fresh install and database for each): each leaves the
release as it found it, and the last one uninstalls it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.quantities import cpu_millis, memory_bytes
from tests.support.deploy import (
    FULLNAME,
    GPU_CLASS,
    GPU_DRIVER,
    GPU_NODE,
    IMAGE,
    KUBE_VERSION,
    NAMESPACE,
    NODES,
    RELEASE,
    SCHEDULER_PODS,
    SERVER_PODS,
    Release,
    busybox_pod,
    caller,
    wait_rollout,
)
from tests.support.gpu import job_gpus
from tests.support.realenv import wait_until
from tests.support.slurm_cluster import SlurmCluster
from tests.support.slurm_fixtures import marked

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slurm,
    pytest.mark.postgres,
    pytest.mark.deploy,
    pytest.mark.slow,
]

# A container that runs until told to stop, then takes a few seconds to do so: what a
# pod's holding must outlast (deletionTimestamp set, containers still running).
# On SIGTERM the container keeps running until the test creates /tmp/stop in it (kubectl
# exec): how long it stops for is the test's to say, not a sleep's that a loaded machine
# may outrun.
TRAPS_TERM = "trap 'echo stopping; until [ -e /tmp/stop ]; do sleep 0.2; done; " \
    "echo stopped; exit 0' TERM; echo started; while true; do sleep 1; done"  # fmt: skip


@pytest.fixture
def pods(release: Release) -> Iterator[list[str]]:
    """Names of the pods a test creates in the default namespace, deleted afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        release.kube.kubectl(
            "delete", "pod", name, "--ignore-not-found", "--grace-period=1", "--wait=false"
        )
    for name in names:
        wait_until(lambda n=name: release.kube.pod(n) is None, 60, 0.5, f"pod {name} gone")


def run_pod(release: Release, pods: list[str], obj: dict[str, Any]) -> dict[str, Any]:
    """Create the pod and wait until it runs; the pod as it then is."""
    pods.append(obj["metadata"]["name"])
    release.kube.create(obj)
    name = obj["metadata"]["name"]
    return wait_until(
        lambda: (p := release.kube.pod(name)) and p["status"].get("phase") == "Running" and p,
        120,
        0.5,
        f"pod {name} running",
    )


def test_the_service_runs_from_its_image_as_two_ready_replicas(release: Release) -> None:
    deployment = release.kube.kubectl_json("-n", NAMESPACE, "get", "deployment", FULLNAME)
    assert deployment["status"].get("readyReplicas") == 2
    servers = release.pods(SERVER_PODS)
    assert {c["image"] for p in servers for c in p["spec"]["containers"]} == {IMAGE}
    for pod in servers:
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"], status
        assert status["restartCount"] == 0, status
    # Both replicas answer on their own address, one database behind them.
    ips = release.ready_server_ips()
    assert len(ips) == 2
    body = release.api("GET", "/readyz").json()
    assert body["checks"]["database"] == "ok", body
    # A drain evicts one of them at a time: the budget allows one disruption now.
    budget = release.kube.kubectl_json("-n", NAMESPACE, "get", "poddisruptionbudget", FULLNAME)
    assert budget["status"]["currentHealthy"] == 2
    assert budget["status"]["disruptionsAllowed"] == 1


def test_readiness_means_the_database_answers(release: Release) -> None:
    """The readiness probe takes a replica out of its Service when its database is gone,
    and puts it back when the database returns; liveness does not restart it meanwhile."""
    postgres = release.values["database"]["url"]
    assert postgres
    release.stop_database()
    try:
        wait_until(lambda: not release.ready_server_ips(), 60, 1, "every replica unready")
    finally:
        release.start_database()
    wait_until(lambda: len(release.ready_server_ips()) == 2, 90, 1, "both replicas ready")
    restarts = [
        p["status"]["containerStatuses"][0]["restartCount"] for p in release.pods(SERVER_PODS)
    ]
    assert restarts == [0, 0]


def test_genericnodes_appear_for_the_real_nodes(release: Release) -> None:
    def names() -> set[str]:
        items = release.kube.kubectl_json("get", "genericnodes")["items"]
        return {g["metadata"]["name"] for g in items}

    wait_until(lambda: names() == set(NODES), 60, 1, f"GenericNodes {', '.join(NODES)}")
    # The nodes' kubelets are the release the suite pins (the newest supported minor).
    kubelets = {
        n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"]
        for n in release.kube.kubectl_json("get", "nodes")["items"]
    }
    assert kubelets == dict.fromkeys(NODES, KUBE_VERSION)
    n1 = release.ledger_node("n1")
    assert n1["admissible"], n1
    # The smaller of the kubelet's allocatable (this machine) and Slurm's n1.
    assert n1["capacity"]["cpu"] == release.kube.get("node", "n1")["status"]["allocatable"]["cpu"]


def test_the_scheduler_pod_admits_a_pod_that_runs_and_holds_until_its_containers_stop(
    release: Release, pods: list[str]
) -> None:
    """Admitted through the chart's scheduler (a pod that calls the extender with its TLS
    client certificate: a refused certificate would fail the bind), the pod's container
    really starts; deleted, the pod keeps its holding while its container handles SIGTERM,
    and loses it once the container has stopped."""
    [scheduler] = release.pods(SCHEDULER_PODS)
    assert scheduler["status"]["phase"] == "Running"
    pod = run_pod(release, pods, busybox_pod("life", TRAPS_TERM, grace=300))
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    wait_until(lambda: "started" in release.kube.kubectl("logs", "life"), 30, 0.5, "started")
    held = wait_until(lambda: release.holding_of(uid, node), 30, 0.5, "the pod's holding")
    assert held["requests"]["cpu"] == "100m", held

    release.kube.kubectl("delete", "pod", "life", "--wait=false")
    terminating = wait_until(
        lambda: (p := release.kube.pod("life")) and p["metadata"].get("deletionTimestamp") and p,
        60,
        0.2,
        "the pod terminating",
    )
    assert terminating["status"]["phase"] == "Running"
    wait_until(lambda: "stopping" in release.kube.kubectl("logs", "life"), 60, 0.2, "SIGTERM")
    # The container is still stopping: the resources are still in use.
    assert release.holding_of(uid, node) is not None
    release.kube.kubectl("exec", "life", "--", "touch", "/tmp/stop")
    wait_until(lambda: release.kube.pod("life") is None, 60, 0.5, "the pod gone")
    wait_until(lambda: release.holding_of(uid, node) is None, 30, 0.5, "the holding released")


def test_a_daemonsets_pods_on_managed_nodes_are_held(release: Release) -> None:
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": busybox_pod("agent", "sleep 3600", scheduler=None, cpu="50m", grace=1)[
                    "spec"
                ],
            },
        },
    }
    release.kube.create(daemonset)
    try:
        wait_until(
            lambda: len(_running(release, "app=agent")) == len(NODES),
            120,
            1,
            "an agent pod per node",
        )
        for pod in _running(release, "app=agent"):
            node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
            held = wait_until(
                lambda u=uid, n=node: release.holding_of(u, n), 30, 0.5, f"{uid} held"
            )
            assert held["requests"]["cpu"] == "50m"
    finally:
        release.kube.kubectl("delete", "daemonset", "agent", "--wait=true", timeout=120)
    wait_until(lambda: not release.kube.kubectl_json("get", "pods", "-l", "app=agent")["items"],
               60, 0.5, "the agent pods gone")  # fmt: skip
    for node in NODES:
        held = [h for h in release.ledger_node(node)["holdings"] if "agent" in h["holder"]["name"]]
        assert not held, held


def _live(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp")


def _running(release: Release, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = release.kube.kubectl_json("get", "pods", "-l", selector)["items"]
    return [p for p in items if p["status"].get("phase") == "Running"]


def test_a_pod_and_a_slurm_job_share_a_nodes_cpus(release: Release, pods: list[str]) -> None:
    """From inside the cluster the service tells Slurm what pods hold on n1 (this one, the
    service's own and the DNS pod, rounded up to whole CPUs): a job gets every whole core
    they leave, and not one CPU more."""
    slurm = release.slurm
    cpus = int(slurm.node("n1")["cpus"])
    pod = run_pod(
        release,
        pods,
        busybox_pod("coloc", "sleep 3600", cpu="1", node_selector={"kubernetes.io/hostname": "n1"}),
    )
    assert pod["spec"]["nodeName"] == "n1"
    uid = pod["metadata"]["uid"]
    wait_until(lambda: release.holding_of(uid, "n1"), 30, 0.5, "the pod's holding")
    held = release.ledger_node("n1")["held_by_kubernetes"]["cpu_millis"]
    left = cpus - math.ceil(held / 1000)
    assert left < cpus
    wait_until(lambda: slurm.k8s_counts("n1")["k8scpu"] == left, 30, 0.5, f"k8scpu {left}")
    # The job_submit plugin asks for k8scpu as many as the job's CPUs: one asking more than
    # is left waits for the pods (the chart's jobs queue, on by default, with slurm.conf's
    # extra_constraints), where Slurm alone would refuse it at submit.
    wait_until(lambda: marked(slurm), 30, 0.5, "every Slurm node marked for the jobs queue")
    # Slurm allocates whole cores (n1: 2 threads each), and the plugin asks for the CPUs
    # Slurm allocates: an odd number left is one CPU short of its last core. Which it is
    # depends on where the service's replicas run (50m each).
    threads = int(slurm.node("n1")["threads"])
    whole = left - left % threads
    fits = slurm.sbatch("-w", "n1", "-c", str(whole), "--wrap", "sleep 300")
    larger = ""
    try:
        seen: list[str] = []  # why it waits, if it does: in the failure's message

        def running() -> bool:
            job = slurm.job(fits)
            seen[:] = [f"{job.get('job_state')} {job.get('state_reason')}",
                       f"extra {job.get('extra')!r}, memory {job.get('memory_per_node')}, "
                       f"{job.get('memory_per_cpu')}, cpus {job.get('cpus')}",
                       str(slurm.node("n1"))]  # fmt: skip
            return slurm.job_state(fits) == "RUNNING"

        try:
            wait_until(running, 30, 0.5, f"the job that fits ({whole} CPUs)")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen}") from exc
        larger = slurm.sbatch("-w", "n1", "-c", str(left + 1), "--wrap", "sleep 300")
        assert _scheduler_reason(slurm, larger) == "Constraints"
        node = wait_until(
            lambda: (n := release.ledger_node("n1"))["held_by_slurm"]["cpu_millis"] and n,
            30,
            0.5,
            "the job held in the ledger",
        )
        assert node["held_by_slurm"]["cpu_millis"] == whole * 1000, node
        assert slurm.job_state(larger) == "PENDING"
    finally:
        slurm.scancel(*filter(None, (fits, larger)))


def _placeholder_amount(pod: dict[str, Any] | None, what: str, where: str = "spec") -> int:
    """A placeholder's request of ``what`` (cpu: millicores, memory: bytes; 0: none): as
    asked (``spec``), or as its kubelet has applied it (``status``, after a resize)."""
    if pod is None:
        return 0
    if where == "spec":
        resources = pod["spec"]["containers"][0]["resources"]
    else:
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        resources = statuses[0].get("resources") or {}
    amount = (resources.get("requests") or {}).get(what, "0")
    return cpu_millis(amount) if what == "cpu" else memory_bytes(amount)


# A caller allowed to admit and release.
WRITER = caller(
    "nl-writer", "{apiGroups: [nodeledger.io], resources: [admissions], verbs: [create, delete]}"
)


def test_a_placeholder_pod_is_resized_in_place_by_its_kubelet(
    release: Release, pods: list[str]
) -> None:
    """The chart's kube.placeholders (on in these values): n1's placeholder pod, which
    carries what the ledger keeps from pods there (here manual holdings, Slurm-confirmed:
    exact amounts, where one job would overcommit these kubelets' 2 CPUs), runs on its
    kubelet and is resized in place by it (same container, no restart) as they change, so
    that the scheduler, filtering by itself, keeps a pod off them."""
    kube = release.kube
    name = "nodeledger-held-n1"
    kube.kubectl("apply", "-f", "-", input=WRITER)
    token = kube.kubectl("-n", "default", "create", "token", "nl-writer").strip()
    auth = {"Authorization": f"Bearer {token}"}
    seen: list[Any] = []  # the last look, for a failure's message

    def placeholder() -> dict[str, Any] | None:
        return kube.get("pod", name, NAMESPACE)

    def applied(memory: int) -> dict[str, Any] | None:
        """The placeholder once it runs, asks ``memory`` bytes, and its kubelet has
        applied them."""
        pod = placeholder()
        seen[:] = [pod and (pod["spec"]["containers"][0]["resources"], pod["status"])]
        if pod is None or pod["status"].get("phase") != "Running":
            return None
        asked = _placeholder_amount(pod, "memory")
        done = asked == memory and _placeholder_amount(pod, "memory", "status") == asked
        return pod if done else None

    def waited(what: str, check: Any) -> Any:
        try:
            return wait_until(check, 120, 0.5, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen}, node {release.ledger_node('n1')}") from exc

    def hold(holder: str, cpu: str, memory: str) -> None:
        body = {"node": "n1", "holder": {"kind": "manual", "id": holder},
                "requests": {"cpu": cpu, "memory": memory}}  # fmt: skip
        release.api("POST", "/v1/admissions", json=body, headers=auth).raise_for_status()

    mib = 2**20
    base = _placeholder_amount(placeholder(), "memory")  # what n1 keeps from pods already
    try:
        hold("placeholder-a", "200m", "1000Mi")
        pod = waited("n1's placeholder running", lambda: applied(base + 1000 * mib))
        hold("placeholder-b", "100m", "500Mi")
        resized = waited("resized in place by its kubelet", lambda: applied(base + 1500 * mib))
        assert resized["metadata"]["uid"] == pod["metadata"]["uid"]
        assert resized["status"]["containerStatuses"][0]["restartCount"] == 0
        # A pod asking a little more CPU than the placeholder leaves on n1 waits, with
        # kube-scheduler's own reason (the extender was not asked), where it would fit
        # without the placeholder.
        pods_hold = release.ledger_node("n1")["held_by_kubernetes"]["cpu_millis"]
        allocatable = cpu_millis(kube.get("node", "n1")["status"]["allocatable"]["cpu"])
        left = allocatable - pods_hold - _placeholder_amount(resized, "cpu")
        asked = max(left, 0) + 100
        assert asked <= allocatable - pods_hold, (allocatable, pods_hold, left)
        waiting = busybox_pod("over", "sleep 3600", cpu=f"{asked}m",
                              node_selector={"kubernetes.io/hostname": "n1"})  # fmt: skip
        pods.append("over")
        kube.create(waiting)
        wait_until(
            lambda: "Insufficient cpu" in _events(release, "over"), 60, 0.5, "FailedScheduling"
        )
        assert kube.pod_node("over") is None
    finally:
        for holder in ("placeholder-a", "placeholder-b"):
            release.api("DELETE", f"/v1/admissions/{holder}", params={"kind": "manual"},
                        headers=auth)  # fmt: skip
    waited("the placeholder back to base",
           lambda: _placeholder_amount(placeholder(), "memory") == base)  # fmt: skip


def test_a_pods_in_place_growth_waits_until_the_node_has_room_for_it(
    release: Release, pods: list[str]
) -> None:
    """A pod on n1 resized in place (kubectl's resize subresource) while the ledger keeps
    all but half its growth for others (a manual holding, Slurm-confirmed): its kubelet
    defers the resize (the placeholder keeps that share), the ledger holds the pod as before
    and says why in an Event; once the holding goes, the growth is admitted (confirmed by
    Slurm) and the kubelet applies it. A manual holding, not a job: any Slurm job takes a
    whole core of these kubelets' 2 CPUs, which overcommits the node's CPUs in the ledger
    (it then admits nothing, for another reason than the growth's)."""
    kube = release.kube
    mib = 2**20
    growth = 1000 * mib
    kube.kubectl("apply", "-f", "-", input=WRITER)
    token = kube.kubectl("-n", "default", "create", "token", "nl-writer").strip()
    auth = {"Authorization": f"Bearer {token}"}
    on_n1 = {"kubernetes.io/hostname": "n1"}
    pod = run_pod(release, pods, busybox_pod("grows", "sleep 3600", memory="64Mi",
                                             node_selector=on_n1))  # fmt: skip
    uid = pod["metadata"]["uid"]

    def held() -> int:
        holding = release.holding_of(uid, "n1")
        return int(holding["requests"]["memory_bytes"]) if holding else 0

    def applied() -> int:
        """The pod's memory request as its kubelet applied it."""
        statuses = (kube.pod("grows") or {}).get("status", {}).get("containerStatuses") or [{}]
        requests = (statuses[0].get("resources") or {}).get("requests") or {}
        return memory_bytes(requests.get("memory", "0"))

    wait_until(lambda: held() == 64 * mib, 30, 0.5, "the pod's holding")
    free = int(release.ledger_node("n1")["free"]["memory_bytes"])
    body = {"node": "n1", "holder": {"kind": "manual", "id": "most-of-n1"},
            "requests": {"cpu": "100m", "memory": str(free - growth // 2)}}  # fmt: skip
    release.api("POST", "/v1/admissions", json=body, headers=auth).raise_for_status()
    seen: list[Any] = []
    try:
        allocatable = memory_bytes(kube.get("node", "n1")["status"]["allocatable"]["memory"])

        def kept() -> bool:
            """The placeholder, applied by its kubelet, leaves it less than the growth."""
            node = release.ledger_node("n1")
            ph = kube.get("pod", "nodeledger-held-n1", NAMESPACE)
            size = _placeholder_amount(ph, "memory", "status")
            pods_hold = int(node["held_by_kubernetes"]["memory_bytes"])
            seen[:] = [size, pods_hold, allocatable, ph and ph.get("status")]
            return size > 0 and allocatable - pods_hold - size < growth

        try:
            wait_until(kept, 120, 0.5, "the placeholder keeping the holding's memory")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen}") from exc
        patch = {"spec": {"containers": [
            {"name": "main", "resources": {"requests": {"memory": f"{64 + 1000}Mi"}}}
        ]}}  # fmt: skip
        kube.kubectl("patch", "pod", "grows", "--subresource", "resize", "-p", json.dumps(patch))
        # Not applied, nor held: the service acts on a change within about a second, and the
        # kubelet retries a deferred resize as soon as any pod on n1 is resized (the
        # placeholder).
        for _ in range(20):
            assert applied() == 64 * mib, (applied(), release.ledger_node("n1"))
            assert held() == 64 * mib
            time.sleep(0.5)
        # The kubelet tried it and deferred it (its pod condition); the Event says why.
        wait_until(lambda: _resize_pending(kube.pod("grows")), 60, 0.5, "the resize deferred")
        wait_until(
            lambda: "ResizeNotAdmitted" in _event_reasons(release, "grows"),
            60, 0.5, "the Event saying why",
        )  # fmt: skip
        assert applied() == held() == 64 * mib
    finally:
        release.api("DELETE", "/v1/admissions/most-of-n1", params={"kind": "manual"},
                    headers=auth)  # fmt: skip
    wait_until(lambda: applied() == 1064 * mib, 120, 0.5, "the resize applied")
    assert held() == 1064 * mib


def _event_reasons(release: Release, pod: str) -> str:
    out = release.kube.kubectl_json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}"
    )
    return " ".join(e.get("reason", "") for e in out["items"])


def _resize_pending(pod: dict[str, Any] | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "PodResizePending" and c["status"] == "True" for c in conditions)


def _events(release: Release, pod: str) -> str:
    out = release.kube.kubectl_json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}"
    )
    return " ".join(e.get("message", "") for e in out["items"])


# Prints what the container runtime gave the container (the plugin's CDI edits), then sleeps.
SEES_ITS_GPU = "env | grep ^NODELEDGER_GPU_ | sort; ls /dev | grep ^nvidia; echo done; sleep 3600"
OURS = "app.kubernetes.io/managed-by=nodeledger"  # the service's DeviceTaintRules


def _scheduler_reason(slurm: SlurmCluster, job: str) -> str:
    """The job's state reason once slurmctld's scheduler has looked at it."""
    reason: str = wait_until(
        lambda: (r := slurm.job(job).get("state_reason")) not in (None, "", "None") and r,
        60,
        0.5,
        f"the scheduler's reason for job {job}",
    )
    return reason


def _gpu_pod(name: str, claim: str | None = None) -> dict[str, Any]:
    """A one-GPU pod on the GPU node: by a ResourceClaim, or of the old shape (a plain
    ``nvidia.com/gpu`` limit, allocated through the chart's DeviceClass)."""
    pod = busybox_pod(
        name, SEES_ITS_GPU, grace=1, node_selector={"kubernetes.io/hostname": GPU_NODE}
    )
    container = pod["spec"]["containers"][0]
    if claim:
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    else:
        container["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    return pod


def _allocated(release: Release, pod: dict[str, Any]) -> tuple[str, int, str]:
    """The device the pod's claim (its own, or the one kube-scheduler generated for a plain
    GPU limit) was allocated: its name, and the index and uuid its slice publishes."""
    claims = pod["spec"].get("resourceClaims") or []
    if claims:
        name = claims[0]["resourceClaimName"]
    else:
        name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = release.kube.get("resourceclaim", name, "default")
    assert claim is not None, name
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (GPU_DRIVER, GPU_NODE), result
    slices = release.kube.kubectl_json(
        "get", "resourceslices", "--field-selector", f"spec.nodeName={GPU_NODE}"
    )["items"]
    [device] = [d for s in slices for d in s["spec"]["devices"] if d["name"] == result["device"]]
    attributes = device["attributes"]
    return result["device"], attributes["index"]["int"], attributes["uuid"]["string"]


def _taints(release: Release) -> dict[str, str]:
    """The service's DeviceTaintRules on the GPU node: device -> the Slurm job named."""
    rules = release.kube.kubectl_json("get", "devicetaintrules", "-l", OURS)["items"]
    return {
        r["spec"]["deviceSelector"]["device"]: r["spec"]["taint"]["value"]
        for r in rules
        if r["spec"]["deviceSelector"]["pool"] == GPU_NODE
    }


def test_gpu_pods_run_with_their_devices_and_slurm_jobs_get_the_others(
    release: Release, pods: list[str]
) -> None:
    """On the GPU node, through the chart's scheduler and the service's image: a pod with a
    ResourceClaim and a plain ``nvidia.com/gpu`` pod run, each container seeing exactly the
    device it was allocated, each device held in Slurm by a hold job; ``sbatch
    --gres=gpu:1`` jobs get the other two devices (tainted for Kubernetes while they run),
    and a third job waits."""
    slurm, kube = release.slurm, release.kube
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claimed", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}]}
        },
    }
    kube.create(claim)
    jobs: list[str] = []
    seen: dict[str, dict[str, Any]] = {}
    try:
        indices: set[int] = set()
        for name, claimed in (("gpu-claimed", "gpu-claimed"), ("gpu-plain", None)):
            started = time.monotonic()
            pod = run_pod(release, pods, _gpu_pod(name, claimed))
            running_after = time.monotonic() - started
            device, index, gpu_uuid = _allocated(release, pod)
            logs = wait_until(
                lambda n=name: "done" in (out := kube.kubectl("logs", n)) and out,
                60,
                0.5,
                f"{name}'s output",
            )
            assert logs.split() == [f"NODELEDGER_GPU_{index}={gpu_uuid}", f"nvidia{index}",
                                    "done"], (name, device, logs)  # fmt: skip
            held = release.holding_of(pod["metadata"]["uid"], GPU_NODE)
            assert held is not None, f"{name} runs without a holding"
            assert held["devices"] == [{"index": index, "uuid": gpu_uuid}], held
            assert held["slurm_hold"], held
            assert job_gpus(slurm, held["slurm_hold"])[1] == {index}
            indices.add(index)
            seen[name] = {"device": device, "hold_job": held["slurm_hold"],
                          "create_to_running_s": round(running_after, 2)}  # fmt: skip
        assert len(indices) == 2, indices

        for _ in range(3):
            jobs.append(slurm.sbatch("-w", GPU_NODE, "-c", "1", "--mem=100", "--gres=gpu:1",
                                     "--wrap", "sleep 600"))  # fmt: skip
        *first, last = jobs
        given: dict[str, int] = {}
        for job in first:
            wait_until(lambda j=job: slurm.job_state(j) == "RUNNING", 60, 0.5, f"job {job}")
            [given[job]] = job_gpus(slurm, job)[1]
        assert set(given.values()) == set(range(4)) - indices, given
        # Visible to Kubernetes: each job's device tainted with its job, the pods' not.
        expected = {f"gpu{index}": job for job, index in given.items()}
        wait_until(lambda: _taints(release) == expected, 60, 0.5, f"taints {expected}")
        reason = _scheduler_reason(slurm, last)
        assert slurm.job_state(last) == "PENDING", reason
        print(f"gpu pods from the chart: {slurm.release} {seen} jobs {given} waiting {last}")
    finally:
        if jobs:
            slurm.scancel(*jobs)
        kube.kubectl("delete", "resourceclaim", "gpu-claimed", "--wait=false", check=False)
    wait_until(lambda: not _taints(release), 60, 0.5, "the jobs' taints gone")


def test_helm_upgrade_rolls_the_replicas_without_losing_a_holding(
    release: Release, pods: list[str]
) -> None:
    pod = run_pod(release, pods, busybox_pod("steady", "sleep 3600"))
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    wait_until(lambda: release.holding_of(uid, node), 30, 0.5, "the pod's holding")
    before = {p["metadata"]["name"] for p in release.pods(SERVER_PODS)}

    lost: list[str] = []
    done = threading.Event()

    def watch() -> None:  # the holding as every ready replica sees it, during the roll
        while not done.is_set():
            try:
                if release.holding_of(uid, node) is None:
                    lost.append(time.strftime("%H:%M:%S"))
            except Exception:  # a replica going away mid-call: not a lost holding
                pass
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        release.helm(
            "upgrade", RELEASE, str(release.chart), "-n", NAMESPACE, "-f", str(release.values_file),
            "--set", "kube.resyncPeriod=120", "--wait", "--timeout", "5m",
        )  # fmt: skip
        wait_rollout(release.kube, f"deployment/{FULLNAME}")
    finally:
        done.set()
        watcher.join()
    after = {p["metadata"]["name"] for p in release.pods(SERVER_PODS) if _live(p)}
    assert len(after) == 2
    assert not before & after, "every replica was replaced"
    assert not lost, f"the holding was missing at {lost}"
    assert release.holding_of(uid, node) is not None


def _slurm_state(release: Release, name: str) -> tuple[set[str], str]:
    node = release.slurm.node(name)
    return set(node["state"]), str(node.get("reason") or "")


def _left_as_it_is(release: Release) -> bool:
    """The service's event for an uncordon it did not relay (an administrator's drain)."""
    params = {"node": "n1", "kind": "maintenance"}
    said = release.api("GET", "/v1/events", params=params).json()
    return any(e["message"].startswith("Slurm node n1 left as it is") for e in said)


def test_kubectl_drain_drains_slurm_and_the_uncordon_resumes_it(
    release: Release, pods: list[str]
) -> None:
    """`kubectl drain` of n1, where a pod runs beside a Slurm job: the Slurm node drains
    (the job runs on, a new one waits), the pod is evicted; the uncordon resumes Slurm and
    the waiting job starts. An administrator's drain that came while the Node was cordoned
    stays after the uncordon."""
    slurm = release.slurm
    pod = busybox_pod("drained", "sleep 3600", node_selector={"kubernetes.io/hostname": "n1"})
    pod["metadata"]["labels"] = {"test": "drained"}
    run_pod(release, pods, pod)
    running = slurm.sbatch("-w", "n1", "-c", "1", "--wrap", "sleep 300")
    waiting = ""
    try:
        wait_until(lambda: slurm.job_state(running) == "RUNNING", 60, 0.5, "the job running")
        # Only the test's pod is evicted: the service's own replicas stay where they are.
        release.kube.kubectl(
            "drain", "n1", "--pod-selector=test=drained", "--force", "--timeout=120s",
            timeout=180,
        )  # fmt: skip
        wait_until(lambda: "DRAIN" in _slurm_state(release, "n1")[0], 60, 0.5, "n1 drained")
        assert _slurm_state(release, "n1")[1].startswith("nodeledger: cordoned in Kubernetes")
        assert release.kube.pod("drained") is None
        assert slurm.job_state(running) == "RUNNING"
        waiting = slurm.sbatch("-w", "n1", "-c", "1", "--wrap", "sleep 300")
        # Pending once the scheduler has looked at it, for the drain (ReqNodeNotAvail).
        reason = _scheduler_reason(slurm, waiting)
        assert slurm.job_state(waiting) == "PENDING", reason
        assert "ReqNodeNotAvail" in str(reason)

        release.kube.kubectl("uncordon", "n1")
        wait_until(lambda: "DRAIN" not in _slurm_state(release, "n1")[0], 60, 0.5, "resumed")
        wait_until(lambda: slurm.job_state(waiting) == "RUNNING", 60, 0.5, "the waiting job")

        release.kube.kubectl("cordon", "n1")
        wait_until(lambda: "DRAIN" in _slurm_state(release, "n1")[0], 60, 0.5, "drained again")
        slurm.run("scontrol", "update", "nodename=n1", "state=drain", "reason=bad DIMM")
        wait_until(
            lambda: "bad DIMM" in (release.ledger_node("n1").get("health_reason") or ""),
            60,
            0.5,
            "the ledger sees the administrator's drain",
        )
        release.kube.kubectl("uncordon", "n1")
        wait_until(lambda: _left_as_it_is(release), 60, 0.5, "the uncordon handled")
        state, reason = _slurm_state(release, "n1")
        assert "DRAIN" in state
        assert reason == "bad DIMM"
    finally:
        slurm.scancel(*(j for j in (running, waiting) if j))
        release.kube.kubectl("uncordon", "n1", check=False)
        slurm.run("scontrol", "update", "nodename=n1", "state=resume", check=False)
        wait_until(lambda: "DRAIN" not in _slurm_state(release, "n1")[0], 60, 0.5, "n1 back")


def _released_with(release: Release, uid: str) -> str | None:
    """The message of the pod's release event, None while it holds."""
    response = release.api("GET", "/v1/events", params={"node": "n2", "kind": "released"})
    response.raise_for_status()
    for event in response.json():
        if event["holder_id"] == uid:
            message: str = event["message"]
            return message
    return None


def test_a_lost_kubelets_pod_holds_until_the_node_is_out_of_service(
    release: Release, pods: list[str]
) -> None:
    """n2's kubelet is killed while a pod runs there: its containers may still run, so the
    pod, force-deleted, keeps its holding (and Slurm keeps its CPUs withheld) until the
    operator's out-of-service taint; then the release names that proof and a job that
    needs those CPUs runs. The kubelet comes back afterwards."""
    slurm = release.slurm
    pod = run_pod(
        release,
        pods,
        busybox_pod(
            "stranded", "sleep 3600", cpu="1", node_selector={"kubernetes.io/hostname": "n2"}
        ),
    )
    uid = pod["metadata"]["uid"]
    wait_until(lambda: release.holding_of(uid, "n2"), 30, 0.5, "the pod's holding")
    held = release.ledger_node("n2")["held_by_kubernetes"]["cpu_millis"]
    cpus = int(slurm.node("n2")["cpus"])
    left = cpus - math.ceil(held / 1000)
    wait_until(lambda: slurm.k8s_counts("n2")["k8scpu"] == left, 30, 0.5, f"k8scpu {left}")

    def ready() -> str:
        node = release.kube.get("node", "n2") or {}
        conditions = node.get("status", {}).get("conditions") or []
        return next((c["status"] for c in conditions if c["type"] == "Ready"), "")

    taint = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    release.kube.script("kill-kubelet", "n2")
    try:
        # The node lifecycle controller's grace period (20 s on the test cluster) first.
        wait_until(lambda: ready() != "True", 120, 1, "n2 not Ready")
        release.kube.kubectl("delete", "pod", "stranded", "--force", "--grace-period=0")
        assert release.kube.pod("stranded") is None
        wait_until(
            lambda: max(release.replica_metric("nodeledger_kube_orphaned_pod_holdings")) >= 1,
            60,
            0.5,
            "the holding kept as orphaned",
        )
        assert release.holding_of(uid, "n2") is not None
        assert slurm.k8s_counts("n2")["k8scpu"] <= left  # still withheld from Slurm

        release.kube.kubectl("taint", "node", "n2", taint)
        message = wait_until(lambda: _released_with(release, uid), 60, 0.5, "the release")
        assert message is not None
        assert "proof: out-of-service-taint" in message, message
        assert release.holding_of(uid, "n2") is None
        # The taint (NoExecute) takes every pod off n2, the service's own included: all of
        # n2 goes back to Slurm, and a job of the whole node (more than the pod left it) runs.
        wait_until(lambda: slurm.k8s_counts("n2")["k8scpu"] == cpus, 60, 0.5, f"k8scpu {cpus}")
        job = slurm.sbatch("-w", "n2", "-c", str(cpus), "--wrap", "sleep 300")
        try:
            wait_until(lambda: slurm.job_state(job) == "RUNNING", 60, 0.5, "the job on freed CPUs")
        finally:
            slurm.scancel(job)
    finally:
        release.kube.kubectl("taint", "node", "n2", taint + "-", check=False)
        release.kube.script("start-kubelet", "n2", timeout=300)
        wait_rollout(release.kube, f"deployment/{FULLNAME}")


def test_helm_uninstall_leaves_the_crd_and_the_leases(release: Release) -> None:
    release.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m")
    assert release.kube.get("crd", "genericnodes.nodeledger.io") is not None
    assert release.kube.get("deployment", FULLNAME, NAMESPACE) is None
    wait_until(lambda: not release.pods(SERVER_PODS), 60, 0.5, "the replicas gone")
    assert release.kube.get("secret", f"{FULLNAME}-tls", NAMESPACE) is None
    # GenericNodes stay with their CRD.
    names = {
        g["metadata"]["name"] for g in release.kube.kubectl_json("get", "genericnodes")["items"]
    }
    assert names == set(NODES)
    leases = release.kube.kubectl_json("-n", NAMESPACE, "get", "leases")["items"]
    names = {lease["metadata"]["name"] for lease in leases}
    # The scheduler's stays; the controllers' leader deletes its own when it still may (the
    # RBAC goes at the same time): docs/deploy.md names both.
    assert f"{FULLNAME}-scheduler" in names
    assert names <= {FULLNAME, f"{FULLNAME}-scheduler"}
