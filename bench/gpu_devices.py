"""Issue 33's GPU benchmark: the device taints' window, GPU pods beside GPU jobs.

Three figures: how long a Slurm job's device goes untainted (to its DeviceTaintRule, and
from its end to the rule gone), GPU pods beside GPU jobs with the taints on and off, and a
plain ``nvidia.com/gpu`` pod's admission against a claim pod's.

The parts are the GPU tests' own (tests/gpu, through bench/_fixtures): a Slurm test
cluster (node n3: four GPUs, GRES types g0..g3, /dev/nvidia0-3), a Kubernetes 1.37
control plane with the API-only node gpu-1 (= n3) whose four devices a ResourceSlice
publishes, the DeviceClass mapping ``nvidia.com/gpu`` to them (KEP-5004), `nodeledger
serve` (SQLite; Kubernetes, Slurm and the co-managed DRA driver on) and the nodeledger
kube-scheduler (the chart's configuration) calling its extender. Both clusters are the
bench's own, beside the test clusters: its run directory (``--rundir``), its port bases,
and a copy of the main cache's Slurm chroot in ``RUNDIR/cache``; all are stopped and the
run directory removed at the end (``--keep`` keeps the chroot copy for the next run).

No kubelet runs on gpu-1: a pod is *bound* when a watch of the pods first shows its
``spec.nodeName``, where a kubelet node would start it; create-to-bound stands for
create-to-Running. Every pod asks for one GPU; each is deleted with its claim (no
controller manager runs to do it) and the service has released it, and Slurm runs no job,
before the next one is created. Figures in ms unless named otherwise; p50 is the median,
p99 the nearest rank (bench/_stats.py).

- ``taint_window``: a ``--gres=gpu:gN:1`` job (N = 0, 1, 2, 3 in turn), ``--samples``
  jobs, taints on. ``to_visible_ms``: from the job seen RUNNING (slurmrestd polled every
  20 ms) to its rule ``nodeledger-gpu-1-gN`` naming it (the API polled every 20 ms);
  ``to_gone_ms``: from the cancel request (slurmrestd's DELETE, scancel's RPC) to the rule
  gone. One job before them is not counted (the service's first reconcile).
- ``admission``: ``--samples`` pairs, taints on and no job, in alternating order: a plain
  pod (``resources.limits: nvidia.com/gpu: 1``, the scheduler generates its claim) and a
  pod with a ResourceClaim, each created alone; create-to-bound of each kind and their
  ratios (the issue's target: within 1.1x); ``*_bind_ms``: the service's bind call (its
  nodeledger_extender_request_duration_seconds, read before and after each pod), the
  admission proper, and their ratios ``plain_to_claim_bind_*``;
  ``*_held_by_device``: pods whose holding names their device (not a count).
- ``beside_jobs``: ``--rounds`` rounds, the taints on, off, on, off... (the setting
  needs a restart of the service: one service per round), each ``--waves`` waves: a
  ``--gres=gpu:g0:1`` job (``sleep --job-seconds``); ``--settle`` seconds after it is seen
  RUNNING (past the taint window), ``--pods`` claim pods created at once (as many as the
  free devices); the job is cancelled once all are bound. Per setting: create-to-bound,
  and the pods allocated the job's device (lowest first, kube-scheduler allocates gpu0
  unless it is tainted): each waits for the job to end, its bind refused meanwhile
  (``their_create_to_bound_ms``).
  ``rule_visible_at_create``: waves whose rule was listed when their pods were created.
- ``load_1min``: the load average at the start, the end and each wave or sample (the
  machine's cores: ``cpus``).

    python -m bench.gpu_devices [--release 26.05] [--samples 20] [--rounds 4] [--waves 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes import watch as kube_watch

from bench._fixtures import (
    GPU_NODE,
    GPU_SLURM_NODE,
    OURS,
    RESOURCE,
    REST_API,
    SCHEDULER,
    TEST_LABEL,
    DraNode,
    GpuService,
    KubeCluster,
    SlurmCluster,
    cluster_sh,
    dra_node,
    gpu_claim,
    gpu_pod,
    gpu_service,
    kube_cluster_sh,
    main_cache,
    mapping_class,
    migrated,
    plain_pod,
    scale_env,
    seed_cache,
    wait_until,
)
from bench._stats import summary

POLL = 0.02  # seconds between looks at Slurm and at the rules
TAINTS = "NODELEDGER_KUBE_GPU_DEVICE_TAINTS"
GPUS = 4
# Job states in which a job still has (or is about to have) its node's resources.
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}
SELECTOR = ",".join(f"{k}={v}" for k, v in TEST_LABEL.items())


def say(message: str) -> None:
    print(f"gpu-devices: {message}", file=sys.stderr, flush=True)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def seen(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """The perf_counter of the first look (every POLL s) at which ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(POLL)


# ---------------------------------------------------------------------------- the clusters


@contextlib.contextmanager
def own_slurm(release: str, rundir: Path, port_base: int) -> Iterator[SlurmCluster]:
    """A Slurm cluster of the bench's own: the test cluster's chroot copied into
    ``rundir/cache`` (the daemons keep their state inside it), its run link and ports."""
    env = scale_env(0, rundir / "cache", str(rundir), port_base)
    seed_cache(release, rundir / "cache", main=main_cache())
    try:
        cluster_sh(release, "up", timeout=1800, env=env)
        yield SlurmCluster.from_env(release, env)
    finally:
        cluster_sh(release, "down", timeout=300, check=False, env=env)


@contextlib.contextmanager
def own_kube(rundir: Path, port_base: int) -> Iterator[KubeCluster]:
    """A 1.37 control plane of the bench's own (the binaries from the main cache)."""
    env = {
        "NODELEDGER_RUNDIR": str(rundir),
        "NODELEDGER_KUBE_PORT_BASE": str(port_base),
        "NODELEDGER_KUBE_VERSION": "1.37",
    }
    try:
        kube_cluster_sh("up", timeout=1800, env=env)
        yield KubeCluster.from_env(env)
    finally:
        kube_cluster_sh("down", timeout=300, check=False, env=env)


def users_of(rundir: Path) -> list[int]:
    """Processes still running in ``rundir``: chrooted into it (Slurm's daemons, in a mount
    namespace the host does not see) or started on its files (Kubernetes')."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or a zombie
            root = os.readlink(entry / "root")
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
            if root.startswith(str(rundir)) or f"{rundir}/" in command:
                found.append(int(entry.name))
    return found


def remove_rundir(rundir: Path, keep: bool) -> None:
    """The run directory gone (but for the chroot copy with ``keep``), unless a process
    still runs in it: its daemons would lose their files under them."""
    running = users_of(rundir)
    if running:
        say(f"left {rundir}: processes {running} still run in it")
    elif keep:
        for entry in rundir.iterdir():
            if entry.name == "cache":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    else:
        shutil.rmtree(rundir, ignore_errors=True)


# ---------------------------------------------------------------------------- Slurm


@dataclass
class Rest:
    """slurmrestd over one connection: a look every 20 ms would otherwise pay for a new
    connection each time. The token's user is SlurmUser: it may cancel any job."""

    slurm: SlurmCluster
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=f"{self.slurm.url}/slurm/{REST_API}", timeout=10)

    def _call(self, method: str, path: str) -> dict[str, Any]:
        headers = {"X-SLURM-USER-NAME": self.slurm.user, "X-SLURM-USER-TOKEN": self.slurm.token}
        found = self.client.request(method, path, headers=headers)
        found.raise_for_status()
        body: dict[str, Any] = found.json()
        return body

    def state(self, job: str) -> set[str]:
        state = self._call("GET", f"/job/{job}")["jobs"][0]["job_state"]
        return set(state if isinstance(state, list) else [state])

    def cancel(self, job: str) -> None:
        self._call("DELETE", f"/job/{job}")

    def live(self) -> list[str]:
        """Jobs that still have (or will have) resources: none between samples."""
        jobs = self._call("GET", "/jobs/")["jobs"]
        return [str(j["job_id"]) for j in jobs if LIVE & set(j["job_state"])]

    def running(self, job: str) -> float:
        """When the job was first seen RUNNING."""
        return seen(lambda: "RUNNING" in self.state(job), 60, f"job {job} running")


def gpu_job(slurm: SlurmCluster, index: int, seconds: int) -> str:
    return slurm.sbatch("-w", GPU_SLURM_NODE, "-c", "1", "--mem=100",
                        f"--gres=gpu:g{index}:1", "--wrap", f"sleep {seconds}")  # fmt: skip


# ---------------------------------------------------------------------------- Kubernetes


class Kube:
    """Pods, claims and our rules through the Python client: a kubectl process per look
    would cost more than the 20 ms between looks."""

    def __init__(self, dra: DraNode) -> None:
        # Any: bodies go as dicts and reads come back raw, as in the tests.
        self.core: Any = kube_client.CoreV1Api(dra.api)
        self.custom: Any = kube_client.CustomObjectsApi(dra.api)

    def rules(self) -> dict[str, str]:
        """Our DeviceTaintRules: name -> the job its taint names."""
        listed = self.custom.list_cluster_custom_object(
            RESOURCE[0], RESOURCE[1], "devicetaintrules", label_selector=OURS
        )
        return {r["metadata"]["name"]: r["spec"]["taint"]["value"] for r in listed["items"]}

    def create(self, kind: str, name: str) -> tuple[str, float]:
        """A ``claim`` pod (its ResourceClaim created first, not timed) or a ``plain`` one,
        scheduled by the nodeledger profile; its uid and when its create request left."""
        if kind == "claim":
            self.custom.create_namespaced_custom_object(
                *RESOURCE, "default", "resourceclaims", gpu_claim(name)
            )
            body = gpu_pod(name, name)
            body["spec"]["schedulerName"] = SCHEDULER
        else:
            body = plain_pod(name)
        created = time.perf_counter()
        pod = self.core.create_namespaced_pod("default", body)
        return str(pod.metadata.uid), created

    def pod(self, name: str) -> dict[str, Any]:
        """As the API server has it: the client's models may predate 1.37's fields
        (status.extendedResourceClaimStatus)."""
        raw = self.core.read_namespaced_pod(name, "default", _preload_content=False)
        found: dict[str, Any] = json.loads(raw.data)
        return found

    def claim_of(self, name: str) -> str:
        """The pod's claim: its own, or the one kube-scheduler generated for it."""
        generated = self.pod(name)["status"].get("extendedResourceClaimStatus")
        return str(generated["resourceClaimName"]) if generated else name

    def device(self, name: str) -> int:
        """The index of the device allocated to the pod's claim (gpuN: index N)."""
        claim = self.custom.get_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", self.claim_of(name)
        )
        [result] = claim["status"]["allocation"]["devices"]["results"]
        return int(result["device"].removeprefix("gpu"))

    def forget(self, name: str) -> None:
        """The pod gone at once and its claim with it, the claim's finalizer dropped (no
        controller manager runs here): its device is free for the allocator again."""
        claim = self.claim_of(name)
        self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        unfinalized = {"metadata": {"finalizers": None}}
        with contextlib.suppress(kube_client.ApiException):
            self.custom.patch_namespaced_custom_object(
                *RESOURCE, "default", "resourceclaims", claim, unfinalized
            )
        with contextlib.suppress(kube_client.ApiException):
            self.custom.delete_namespaced_custom_object(
                *RESOURCE, "default", "resourceclaims", claim
            )


class Bindings:
    """When each of our pods was first seen bound, from a watch of the pods (its own
    client: the watch holds a connection)."""

    def __init__(self, kube: KubeCluster) -> None:
        self.api: Any = kube_config.new_client_from_config(config_file=str(kube.kubeconfig))
        self.bound: dict[str, float] = {}
        self.changed = threading.Condition()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="bindings", daemon=True)

    def __enter__(self) -> Bindings:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # The watch sees the flag at its next event; a daemon thread, it is not waited for
        # longer (its client closed under it ends it).
        self.stopped.set()
        self.thread.join(1)
        self.api.close()

    def _watch(self) -> None:
        core: Any = kube_client.CoreV1Api(self.api)
        while not self.stopped.is_set():
            # A watch ends after its timeout and starts again with a list: a pod bound
            # meanwhile is seen then, late by at most that reconnection.
            try:
                stream = kube_watch.Watch().stream(
                    core.list_namespaced_pod, "default", label_selector=SELECTOR,
                    timeout_seconds=30,
                )  # fmt: skip
                for event in stream:
                    self._saw(event["object"])
                    if self.stopped.is_set():
                        return
            except Exception as failed:  # a broken watch: say so, watch again
                if self.stopped.is_set():
                    return
                say(f"pod watch: {failed!r}")
                time.sleep(0.5)

    def _saw(self, pod: Any) -> None:
        if pod.spec.node_name:
            with self.changed:
                self.bound.setdefault(pod.metadata.name, time.perf_counter())
                self.changed.notify_all()

    def wait(self, name: str, timeout: float) -> float:
        """When the pod was first seen bound."""
        with self.changed:
            if not self.changed.wait_for(lambda: name in self.bound, timeout):
                raise AssertionError(f"pod {name} not bound within {timeout}s")
            return self.bound[name]


# ---------------------------------------------------------------------------- a run


@dataclass
class Run:
    args: argparse.Namespace
    slurm: SlurmCluster
    dra: DraNode
    rest: Rest
    kube: Kube
    bindings: Bindings
    logs: Path
    load: list[float] = field(default_factory=list)

    def note_load(self) -> None:
        self.load.append(os.getloadavg()[0])

    @contextlib.contextmanager
    def service(self, name: str, taints: bool) -> Iterator[GpuService]:
        """A service of its own ledger, with the nodeledger kube-scheduler, the taints on
        or off (read at start: another setting is another service)."""
        database = migrated(f"sqlite:///{self.logs}/{name}.db")
        extra = {TAINTS: "true" if taints else "false"}
        with gpu_service(GpuService, self.dra, self.slurm, database, self.logs,
                         name=name, scheduler=True, placeholders=False,
                         **extra) as svc:  # fmt: skip
            # The taints off: the service deletes the rules of ours a run left behind.
            wait_until(lambda: taints or not self.kube.rules(), 30, what="no rules")
            yield svc

    def quiet(self, svc: GpuService) -> None:
        """No pod held by the ledger, no job left in Slurm, no rule of ours: the next
        sample starts where the last one did."""

        def still() -> bool:
            holdings = httpx.get(
                f"{svc.url}/v1/holdings",
                params={"node": GPU_NODE, "holder_kind": "pod"},
                timeout=30,
            ).json()
            return bool(holdings or self.rest.live() or self.kube.rules())

        wait_until(lambda: not still(), 60, 0.05, what="pods released, jobs and rules gone")

    def create(self, kind: str) -> Pod:
        name = f"gd-{kind}-{uuid.uuid4().hex[:8]}"
        return Pod(name, *self.kube.create(kind, name))

    def bound(self, svc: GpuService, pods: list[Pod], timeout: float) -> list[Bound]:
        """Each pod once bound: create-to-bound, its device, whether its holding names it."""
        when = [self.bindings.wait(p.name, timeout) for p in pods]
        return [
            Bound(ms(at - p.created), self.kube.device(p.name), self.by_device(svc, p.uid))
            for p, at in zip(pods, when, strict=True)
        ]

    @staticmethod
    def by_device(svc: GpuService, uid: str) -> bool:
        """The ledger holds the pod by its device (not by a count)."""
        held = svc.holding(uid)
        return bool(held and held.get("devices"))

    def forget(self, svc: GpuService, pods: list[Pod]) -> None:
        for p in pods:
            self.kube.forget(p.name)
        self.quiet(svc)


@dataclass(frozen=True)
class Pod:
    name: str
    uid: str
    created: float  # perf_counter when its create request left


@dataclass(frozen=True)
class Bound:
    ms: float  # create to bound
    device: int  # the index of the device its claim was allocated
    by_device: bool  # its holding names that device


# ---------------------------------------------------------------------------- figure 1


def window_sample(run: Run, index: int) -> tuple[float, float]:
    """One job on device ``index``: ms to its rule, ms from its cancel to the rule gone."""
    rule = f"nodeledger-{GPU_NODE}-g{index}"
    job = gpu_job(run.slurm, index, 600)
    running = run.rest.running(job)
    visible = seen(lambda: run.kube.rules().get(rule) == job, 30, f"rule {rule} of {job}")
    cancelled = time.perf_counter()
    run.rest.cancel(job)
    gone = seen(lambda: rule not in run.kube.rules(), 30, f"rule {rule} gone")
    return ms(visible - running), ms(gone - cancelled)


def taint_window(run: Run, svc: GpuService) -> dict[str, Any]:
    shown, gone = [], []
    for i in range(run.args.samples + 1):
        sample = window_sample(run, i % GPUS)
        run.quiet(svc)
        run.note_load()
        if i:  # the first: the service's first reconcile, not counted
            shown.append(sample[0])
            gone.append(sample[1])
    return {
        "to_visible_ms": summary(shown, digits=1, spread=True),
        "to_gone_ms": summary(gone, digits=1, spread=True),
    }


# ---------------------------------------------------------------------------- figure 3


BIND = 'nodeledger_extender_request_duration_seconds_{}{{verb="bind"}}'


def binds(svc: GpuService) -> tuple[float, float]:
    """The extender's bind calls so far: their count and seconds (the service's metric)."""
    figures = {"count": 0.0, "sum": 0.0}
    for line in httpx.get(f"{svc.url}/metrics", timeout=30).text.splitlines():
        for key in figures:
            if line.startswith(BIND.format(key) + " "):
                figures[key] = float(line.split()[-1])
    return figures["count"], figures["sum"]


def admitted(run: Run, svc: GpuService, kind: str) -> tuple[Bound, float]:
    """One pod of ``kind`` bound and forgotten; with the ms its bind calls took in the
    service (read once the call is counted: the pod may be seen bound before)."""
    count, seconds = binds(svc)
    pod = run.create(kind)
    [bound] = run.bound(svc, [pod], 120)

    def counted() -> float:
        """The binds' seconds once this pod's is counted (0: not yet)."""
        found = binds(svc)
        return found[1] if found[0] > count else 0.0

    after = wait_until(counted, 10, 0.02, what="the pod's bind counted")
    run.forget(svc, [pod])
    return bound, ms(after - seconds)


def admission(run: Run, svc: GpuService) -> dict[str, Any]:
    """Plain and claim pods one at a time, in alternating order so that a slow moment of
    the machine falls on both; the first pair is not counted (the service's first binds)."""
    found: dict[str, list[Bound]] = {"plain": [], "claim": []}
    bind: dict[str, list[float]] = {"plain": [], "claim": []}
    for i in range(run.args.samples + 1):
        for kind in ("plain", "claim") if i % 2 else ("claim", "plain"):
            bound, bind_ms = admitted(run, svc, kind)
            if i:
                found[kind].append(bound)
                bind[kind].append(bind_ms)
        run.note_load()
    figures: dict[str, Any] = {}
    for kind, pods in found.items():
        figures[f"{kind}_ms"] = summary([b.ms for b in pods], digits=1, spread=True)
        figures[f"{kind}_bind_ms"] = summary(bind[kind], digits=1)
        figures[f"{kind}_held_by_device"] = sum(b.by_device for b in pods)
    for p in ("p50", "p99"):
        ratio = figures["plain_ms"][p] / figures["claim_ms"][p]
        figures[f"plain_to_claim_{p}"] = round(ratio, 2)
        # The admission itself: the service's bind, which reads the generated claim.
        ratio = figures["plain_bind_ms"][p] / figures["claim_bind_ms"][p]
        figures[f"plain_to_claim_bind_{p}"] = round(ratio, 2)
    return figures


# ---------------------------------------------------------------------------- figure 2


@dataclass
class Setting:
    """One setting's pods beside jobs, over its rounds."""

    pods: list[Bound] = field(default_factory=list)
    waves: int = 0
    rule_visible_at_create: int = 0

    def figures(self) -> dict[str, Any]:
        if not self.pods:
            return {"pods": 0}
        waited = [b for b in self.pods if b.device == 0]
        return {
            "create_to_bound_ms": summary([b.ms for b in self.pods], digits=1, spread=True),
            "pods": len(self.pods),
            "allocated_job_device": len(waited),
            "allocated_job_device_share": round(len(waited) / len(self.pods), 3),
            "their_create_to_bound_ms": summary([b.ms for b in waited], digits=1),
            "held_by_device": sum(b.by_device for b in self.pods),
            "waves": self.waves,
            "rule_visible_at_create": self.rule_visible_at_create,
        }


def wave(run: Run, svc: GpuService, setting: Setting) -> None:
    """A job on device 0, and ``--pods`` claim pods once it has run ``--settle`` s."""
    args = run.args
    job = gpu_job(run.slurm, 0, args.job_seconds)
    running = run.rest.running(job)
    time.sleep(max(0.0, running + args.settle - time.perf_counter()))
    if "RUNNING" not in run.rest.state(job):
        raise AssertionError(f"job {job} ended before the pods: --settle >= --job-seconds?")
    setting.rule_visible_at_create += run.kube.rules().get(f"nodeledger-{GPU_NODE}-g0") == job
    pods = [run.create("claim") for _ in range(args.pods)]
    # A pod given the job's device is bound once the job ends and the scheduler's backoff
    # (at most 10 s) lets it try again.
    setting.pods.extend(run.bound(svc, pods, args.job_seconds + 120))
    setting.waves += 1
    with contextlib.suppress(httpx.HTTPStatusError):  # it may have ended meanwhile
        run.rest.cancel(job)
    run.forget(svc, pods)
    run.note_load()


def warm(run: Run, svc: GpuService) -> None:
    """One claim pod bound and forgotten: a new service's first bind is not measured."""
    pod = run.create("claim")
    run.bound(svc, [pod], 120)
    run.forget(svc, [pod])


def beside_jobs(run: Run) -> dict[str, Any]:
    order = [("on", "off")[k % 2] for k in range(run.args.rounds)]
    settings = {"on": Setting(), "off": Setting()}
    for k, name in enumerate(order):
        say(f"round {k + 1} of {len(order)}: taints {name}")
        with run.service(f"round-{k + 1}-{name}", taints=name == "on") as svc:
            warm(run, svc)
            for _ in range(run.args.waves):
                wave(run, svc, settings[name])
    return {"rounds": order, **{k: s.figures() for k, s in settings.items()}}


# ---------------------------------------------------------------------------- the bench


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--release", default="26.05", help="Slurm release of the cluster")
    add("--samples", type=int, default=20, help="taint windows; plain/claim pod pairs")
    add("--rounds", type=int, default=4, help="service runs, taints on, off, on, off...")
    add("--waves", type=int, default=4, help="jobs (each with --pods pods) per round")
    add("--pods", type=int, default=3, help="claim pods beside each job (<= 3 free GPUs)")
    add("--job-seconds", type=int, default=5, help="each wave's job: sleep this long")
    add("--settle", type=float, default=2.0, help="s from the job RUNNING to its pods")
    add("--rundir", type=Path, default=Path("/tmp/nl-gpu-devices"))
    add("--slurm-port-base", type=int, default=19600)
    add("--kube-port-base", type=int, default=25600)
    add("--keep", action="store_true", help="keep the chroot copy in RUNDIR/cache")
    return parser


def measure(run: Run) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with run.service("taints-on", taints=True) as svc:
        say(f"taint window, {run.args.samples} jobs")
        figures["taint_window"] = taint_window(run, svc)
        say(f"admission, {run.args.samples} plain and claim pods")
        figures["admission"] = admission(run, svc)
    figures["beside_jobs"] = beside_jobs(run)
    return figures


@contextlib.contextmanager
def parts(args: argparse.Namespace) -> Iterator[Run]:
    """The clusters, gpu-1 with its devices and the mapping class, and the pod watch."""
    args.rundir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        stack.callback(remove_rundir, args.rundir, args.keep)
        say(f"Slurm {args.release} and Kubernetes 1.37 in {args.rundir}")
        slurm = stack.enter_context(own_slurm(args.release, args.rundir, args.slurm_port_base))
        kube = stack.enter_context(own_kube(args.rundir, args.kube_port_base))
        dra = stack.enter_context(dra_node(kube))
        kube.create(mapping_class())  # before any service: each says how it maps them
        stack.callback(kube.kubectl, "delete", "devicetaintrules", "-l", OURS, check=False)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-devices-")))
        bindings = stack.enter_context(Bindings(kube))
        yield Run(args, slurm, dra, Rest(slurm), Kube(dra), bindings, logs)


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    started = time.monotonic()
    with parts(args) as run:
        run.note_load()
        figures = {
            "slurm": run.slurm.release,
            "kubernetes": run.dra.kube.version,
            "cpus": os.cpu_count(),
            **measure(run),
        }
        run.note_load()
    load = [round(x, 2) for x in run.load]
    figures["load_1min"] = {
        "start": load[0], "end": load[-1], "max": max(load),
        "mean": round(sum(load) / len(load), 2), "looks": len(load),
    }  # fmt: skip
    figures["wall_s"] = round(time.monotonic() - started)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
