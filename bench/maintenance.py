"""Issue 34's measurement: how fast one maintenance crosses from one scheduler to the other
at site scale, and what relaying it costs admissions.

Per size N: a real 26.05 slurmctld + slurmrestd whose slurm.conf defines N nodes (n1-n8
with a slurmd, s1..s(N-8) that never register, set DOWN), and a real kube-apiserver with
N API-only Nodes, each labelled with its Slurm node's name (nodeledger.io/slurm-node), so
that every one is co-managed; `nodeledger serve` with both integrations on. With
``--hints`` (the default) slurmctld hints as a site with the hook installed would: its
node_features/k8s_resources plugin runs slurm-plugins/hooks/nodeledger-job-hint at each
node state change (as do PrologSlurmctld/EpilogSlurmctld at each job's start and end), and
the service lists every node only every 600 s (NODELEDGER_SLURM_FULL_SYNC_INTERVAL); with
``--no-hints``, the sync lists every node every second and nothing else tells it. The Nodes
of the DOWN Slurm nodes carry the service's taint throughout, as on a site with nodes
down.

On n2..n8 in turn (n1 takes the admissions), each cycle times, polling every 50 ms:
- drain_to_taint_s: `scontrol update nodename=X state=drain reason=...` returned -> the
  Node's NoSchedule taint nodeledger.io/slurm-unavailable (value with DRAIN) read back
  from the API server; resume_to_untaint_s: `state=resume` returned -> the taint without
  DRAIN (Slurm itself shows a resumed node NOT_RESPONDING until its next ping, and the
  taint says so meanwhile: see LIVE);
- cordon_to_drain_s: the Node's spec.unschedulable=true patch returned -> slurmrestd
  showing the node DRAIN with nodeledger's reason; uncordon_to_resume_s: the patch back
  to false -> the node no longer DRAIN. Before each uncordon the ledger has seen the
  service's drain (drain_to_ledger_s; as it would have long before an operator
  uncordons).
- admission_ms: POST /v1/admissions (Slurm-confirmed) on n1's Node, then its release,
  paced (--admission-rate) beside the samples, in phases with the propagation on and off
  (NODELEDGER_KUBE_SLURM_TAINTS / _CORDON_DRAINS_SLURM=false) alternated on, off, off,
  on...: one service runs at a time (two would push one Slurm node's counts against each
  other), restarted on the same ledger for each phase. The off phases do the same drains
  and cordons, each followed by the same reads for as long as it took when on, so that
  only the propagation differs. on_to_off_p50 is the ratio.

    python -m bench.maintenance [--nodes 500,15000] [--samples 40] [--rounds 2] [--keep]
        [--admission-rate 10] [--no-hints] [--service-env KEY=VALUE]

Runs on clusters of its own: Kubernetes in /tmp/nl-maint-scale/kube (ports from 26379),
Slurm in /tmp/nl-maint-scale/slurm (ports from 26600, its own chroot copy in
~/.cache/nl-maint-scale), a SQLite ledger per size; all stopped at the end unless --keep.
Not part of CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.core.maintenance import CORDONED, TAINT_KEY
from app.kube.settings import KubeSettings
from bench._fixtures import REST_API, SlurmCluster, free_port, migrated, pod
from bench._stats import summary
from bench.kubescale.cluster import Api, ControlPlane, admin_client
from bench.kubescale.load import create_all, node_name, node_object
from bench.kubescale.service import Service, settle
from bench.slurm_scale import scale_cluster, size_scale_nodes

REPO = Path(__file__).resolve().parent.parent
RUNDIR = Path("/tmp/nl-maint-scale")
CACHE = Path.home() / ".cache" / "nl-maint-scale"
CRD = REPO / "crds" / "genericnodes.nodeledger.io.yaml"
SLURM_LABEL = str(KubeSettings.model_fields["slurm_node_label"].default)
# The Slurm nodes with a slurmd: n1 admits, the others are sampled in turn. Slurm 26.05
# shows a resumed node NOT_RESPONDING until its next ping (~20 s here), and the ledger
# (so the taint) says so: with seven in turn each has rested that long before its next
# cycle.
LIVE = tuple(f"n{i}" for i in range(1, 9))
POLL = 0.05  # seconds between looks at the other side: the samples' resolution
OFF = {"NODELEDGER_KUBE_SLURM_TAINTS": "false", "NODELEDGER_KUBE_CORDON_DRAINS_SLURM": "false"}
KINDS = (
    "drain_to_taint_s",
    "resume_to_untaint_s",
    "cordon_to_drain_s",
    "uncordon_to_resume_s",
    "drain_to_ledger_s",
    "waited_for_healthy_s",
)


def say(message: str) -> None:
    print(f"maintenance: {message}", file=sys.stderr, flush=True)


def slurm_name(i: int) -> str:
    """The Slurm node of Node ``node_name(i)``: the live ones first, then s1, s2..."""
    return LIVE[i] if i < len(LIVE) else f"s{i - len(LIVE) + 1}"


# ------------------------------------------------------------------------- the two sides


@dataclass
class Sides:
    """What a sample reads and changes: the API server as admin, slurmrestd, scontrol."""

    kube: httpx.Client
    rest: httpx.Client
    slurm: SlurmCluster
    limit: float  # seconds a propagation may take before it counts as not seen

    def taint(self, node: str) -> str | None:
        """The value of the service's taint on the Node, None without one."""
        body = self.kube.get(f"/api/v1/nodes/{node}").raise_for_status().json()
        for taint in body["spec"].get("taints") or ():
            if taint["key"] == TAINT_KEY:
                return str(taint.get("value", ""))
        return None

    def cordon(self, node: str, cordoned: bool) -> None:
        # What `kubectl cordon` sends, minus kubectl's own start-up (not the service's cost).
        self.kube.patch(
            f"/api/v1/nodes/{node}",
            content=json.dumps({"spec": {"unschedulable": cordoned}}),
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()

    def slurm_node(self, name: str) -> tuple[set[str], str]:
        """The node's states and reason as slurmrestd shows them."""
        found = self.rest.get(f"node/{name}").raise_for_status().json()["nodes"][0]
        return set(found["state"]), str(found.get("reason") or "")

    def drained_by_us(self, name: str) -> bool:
        states, reason = self.slurm_node(name)
        return "DRAIN" in states and reason.startswith(CORDONED)

    def scontrol(self, name: str, *update: str) -> None:
        self.slurm.run("scontrol", "update", f"nodename={name}", *update)

    def waited(self, seen: Callable[[], bool]) -> float:
        """Seconds until ``seen()`` holds, polled every POLL; ``inf`` past the limit."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.limit:
            if seen():
                return time.monotonic() - t0
            time.sleep(POLL)
        return math.inf


@contextlib.contextmanager
def sides(slurm: SlurmCluster, kubeconfig: Path, limit: float) -> Iterator[Sides]:
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    rest_url = f"{slurm.url}/slurm/{REST_API}/"
    with (
        admin_client(kubeconfig) as kube,
        httpx.Client(base_url=rest_url, headers=headers, timeout=30) as rest,
    ):
        yield Sides(kube, rest, slurm, limit)


def ledger_health(ledger: httpx.Client, node: str) -> str:
    return str(ledger.get(f"/v1/nodes/{node}").raise_for_status().json()["health_reason"] or "")


def until(check: Callable[[], bool], timeout: float) -> bool:
    """Whether ``check()`` held within ``timeout`` (polled every 0.2 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


# ------------------------------------------------------------------------ one maintenance


def measured_cycle(s: Sides, ledger: httpx.Client, node: str, k: int) -> dict[str, float]:
    """One drain/resume from Slurm and one cordon/uncordon from Kubernetes of ``node``,
    each propagation timed; the node is healthy in the ledger first (waited for: the
    NOT_RESPONDING window Slurm opens at each resume, see LIVE)."""
    slurm = slurm_name(int(node.rsplit("-", 1)[1]))
    times = {"waited_for_healthy_s": s.waited(lambda: ledger_health(ledger, node) == "")}
    s.scontrol(slurm, "state=drain", f"reason=bench-maintenance-{k}")
    times["drain_to_taint_s"] = s.waited(lambda: "DRAIN" in (s.taint(node) or ""))
    s.scontrol(slurm, "state=resume")
    # The resume relayed: the taint no longer says DRAIN (it may say NOT_RESPONDING, which
    # Slurm itself shows until its next ping, and lose it then).
    times["resume_to_untaint_s"] = s.waited(lambda: "DRAIN" not in (s.taint(node) or ""))
    s.cordon(node, True)
    times["cordon_to_drain_s"] = s.waited(lambda: s.drained_by_us(slurm))
    # The resume needs the ledger to have read the service's drain first (by design: it
    # resumes only a drain it can see is its own), as it has long before a site uncordons.
    times["drain_to_ledger_s"] = s.waited(lambda: CORDONED in ledger_health(ledger, node))
    s.cordon(node, False)
    times["uncordon_to_resume_s"] = s.waited(lambda: "DRAIN" not in s.slurm_node(slurm)[0])
    if math.isinf(times["uncordon_to_resume_s"]) and s.drained_by_us(slurm):
        s.scontrol(slurm, "state=resume")  # leave the node as it began for the next sample
    return times


def polled(read: Callable[[], object], seconds: float) -> None:
    """``read()`` every POLL for ``seconds`` (at least once)."""
    t0 = time.monotonic()
    read()
    while time.monotonic() - t0 < seconds:
        time.sleep(POLL)
        read()


def unmeasured_cycle(
    s: Sides, ledger: httpx.Client, node: str, k: int, took: dict[str, float]
) -> None:
    """The same operator actions with the propagation off, each followed by the same reads
    for as long as the step took when on (``took``: its p50 so far), so that the service,
    the API server and slurmrestd answer the bench alike in both modes."""
    slurm = slurm_name(int(node.rsplit("-", 1)[1]))
    polled(lambda: ledger_health(ledger, node), took["waited_for_healthy_s"])
    s.scontrol(slurm, "state=drain", f"reason=bench-maintenance-{k}")
    polled(lambda: s.taint(node), took["drain_to_taint_s"])
    s.scontrol(slurm, "state=resume")
    polled(lambda: s.taint(node), took["resume_to_untaint_s"])
    s.cordon(node, True)
    polled(lambda: s.slurm_node(slurm), took["cordon_to_drain_s"])
    polled(lambda: ledger_health(ledger, node), took["drain_to_ledger_s"])
    s.cordon(node, False)
    polled(lambda: s.slurm_node(slurm), took["uncordon_to_resume_s"])


def took(run: Run) -> dict[str, float]:
    """Each step's p50 so far with the propagation on (--off-wait before any)."""
    return {
        kind: statistics.median(seen)
        if (seen := [x for x in done if math.isfinite(x)])
        else run.args.off_wait
        for kind, done in run.samples.items()
    }


# ------------------------------------------------------------------------------ admissions


@dataclass
class Admissions:
    """Admissions (and releases) of one pod at a time on ``node``, ``rate`` a second, in a
    thread of their own until stopped: the admission's milliseconds, refusals counted."""

    url: str
    node: str
    label: str
    rate: float
    ms: list[float] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Admissions:
        self._thread = threading.Thread(target=self._run, name="admissions", daemon=True)
        self._thread.start()
        return self

    def stop(self, at_least: int, timeout: float) -> None:
        """Stop once ``at_least`` admissions were timed (or ``timeout`` passed)."""
        until(lambda: len(self.ms) + len(self.refused) >= at_least, timeout)
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            due = time.monotonic()
            i = 0
            while not self._stop.is_set():
                self._one(client, f"{self.label}-{i}")
                i += 1
                due += 1 / self.rate
                time.sleep(max(0.0, due - time.monotonic()))

    def _one(self, client: httpx.Client, uid: str) -> None:
        t0 = time.perf_counter()
        try:
            answer = client.post("/v1/admissions", json=pod(self.node, uid))
        except httpx.HTTPError as exc:  # counted, not fatal: the thread must go on
            self.refused.append(f"{type(exc).__name__}: {exc}")
            return
        ms = (time.perf_counter() - t0) * 1000
        if answer.status_code in (200, 201):
            self.ms.append(ms)
            with contextlib.suppress(httpx.HTTPError):  # a release left over is harmless
                client.delete(f"/v1/admissions/{uid}")
        else:
            self.refused.append(f"{answer.status_code} {answer.text[:200]}")


# --------------------------------------------------------------------------------- phases


@dataclass
class Run:
    """One size's clusters and ledger, and what each phase adds to."""

    nodes: int
    plane: ControlPlane
    slurm: SlurmCluster
    database: str
    args: argparse.Namespace
    env: dict[str, str]
    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    admissions: dict[str, list[float]] = field(default_factory=lambda: {"on": [], "off": []})
    phases: list[dict[str, Any]] = field(default_factory=list)

    @property
    def down(self) -> int:
        """Slurm nodes kept DOWN (the Nodes carrying the service's taint, when on)."""
        return self.nodes - len(LIVE)

    def service(self, name: str, env: dict[str, str]) -> Service:
        logs = RUNDIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}-{self.nodes}.log"
        service = Service(self.database, self.plane.kubeconfig, free_port(), log, env)
        if self.args.hints:  # slurmctld's hook posts to this service from now on
            assert self.slurm.hint_config is not None
            self.slurm.hint_config.write_text(f"url={service.url}\ntimeout=2\n")
        return service


def ready(service: Service) -> bool:
    """Leading the Kubernetes controllers, and synced with Slurm at least once."""
    body = service.readyz()
    checks = (body or {}).get("checks", {})
    return checks.get("kubernetes") == "leading" and str(checks.get("slurm", "")).startswith(
        "synced"
    )


def tainted(kube: httpx.Client) -> int:
    """How many Nodes carry the service's taint (one paginated list)."""
    count, token = 0, ""
    while True:
        params = {"limit": "2000", **({"continue": token} if token else {})}
        page = kube.get("/api/v1/nodes", params=params).raise_for_status().json()
        for node in page["items"]:
            count += any(t["key"] == TAINT_KEY for t in node["spec"].get("taints") or ())
        token = page["metadata"].get("continue") or ""
        if not token:
            return count


def settled(s: Sides, on: bool, down: int, timeout: float) -> float | None:
    """Seconds until the leader's taints are as the mode wants (on: every DOWN node's Node
    tainted; off: none, the service removing its own), read from the API server (the
    service's gauges start at 0 before it has looked); None if not within ``timeout``."""
    want = down if on else 0
    t0 = time.monotonic()
    if until(lambda: tainted(s.kube) == want, timeout):
        return round(time.monotonic() - t0, 1)
    return None


def cold_start(run: Run, s: Sides) -> dict[str, Any]:
    """The first start on the empty ledger: every Node discovered, its GenericNode
    written (at --cold-status-qps) and every DOWN node's Node tainted; not measured."""
    qps = str(run.args.cold_status_qps)
    env = {**run.env, "NODELEDGER_KUBE_STATUS_QPS": qps, "NODELEDGER_KUBE_STATUS_BURST": qps}
    service = run.service("cold", env)
    service.start()
    try:
        service.wait("ready", lambda: ready(service), run.args.ready_timeout)
        synced = round(time.monotonic() - service.started, 1)
        taints = settled(s, True, run.down, run.args.ready_timeout)
        writes = settle(service, run.nodes / run.args.cold_status_qps + 300, quiet=10)
    finally:
        service.stop()
    return {"ready_s": synced, "tainted_after_s": taints, **writes}


def phase(run: Run, mode: str, s: Sides, index: int, cycles: int) -> None:
    """One service start in ``mode`` ("on" or "off"): its admissions beside ``cycles``
    maintenance cycles on n2..n8's Nodes in turn, the propagation timed when on."""
    on = mode == "on"
    service = run.service(f"{mode}-{index}", run.env if on else {**run.env, **OFF})
    service.start()
    figures: dict[str, Any] = {"mode": mode, "load_average_start": os.getloadavg()}
    try:
        service.wait("ready", lambda: ready(service), run.args.ready_timeout)
        figures["ready_s"] = round(time.monotonic() - service.started, 1)
        figures["settled_s"] = settled(s, on, run.down, run.args.ready_timeout)
        time.sleep(2)  # the last patches' events, off the first sample
        admitted = Admissions(service.url, node_name(0), f"{mode}-{index}", run.args.admission_rate)
        admitted.start()
        t0 = time.monotonic()
        with httpx.Client(base_url=service.url, timeout=30) as ledger:
            for k in range(cycles):
                node = node_name(1 + (index * cycles + k) % (len(LIVE) - 1))
                if on:
                    for kind, seconds in measured_cycle(s, ledger, node, k).items():
                        run.samples[kind].append(seconds)
                else:
                    unmeasured_cycle(s, ledger, node, k, took(run))
        admitted.stop(run.args.min_admissions, 600)
        run.admissions[mode].extend(admitted.ms)
        figures |= {
            "seconds": round(time.monotonic() - t0, 1),
            "admissions": len(admitted.ms),
            "admission_ms": summary(admitted.ms),
            "refused": len(admitted.refused),
            "refusals": admitted.refused[:3],
            "load_average_end": os.getloadavg(),
        }
    finally:
        service.stop()
        run.phases.append(figures)
        say(f"{run.nodes} nodes: phase {index} {mode}: {json.dumps(figures)}")


def modes(rounds: int) -> list[str]:
    """on, off, off, on, on, off...: each round reverses the last, so drift over the run
    falls on both alike."""
    order: list[str] = []
    for r in range(rounds):
        order += ["on", "off"] if r % 2 == 0 else ["off", "on"]
    return order


def propagation(samples: list[float]) -> dict[str, Any]:
    seen = [x for x in samples if math.isfinite(x)]
    return {**summary(seen, digits=3, spread=True), "not_seen": len(samples) - len(seen)}


def results(run: Run) -> dict[str, Any]:
    on, off = run.admissions["on"], run.admissions["off"]
    admission: dict[str, Any] = {"on": summary(on), "off": summary(off)}
    if on and off:
        admission["on_to_off_p50"] = round(summary(on)["p50"] / summary(off)["p50"], 3)
        admission["on_to_off_p99"] = round(summary(on)["p99"] / summary(off)["p99"], 3)
    return {
        **{kind: propagation(run.samples[kind]) for kind in KINDS},
        "admission_ms": admission,
        "phases": run.phases,
    }


# ----------------------------------------------------------------------------- the clusters


def load_nodes(api: Api, nodes: int) -> dict[str, Any]:
    """Nodes bench-00000.. up to ``nodes``, each labelled with its Slurm node (what an
    earlier, smaller size created is kept)."""
    have = api.run(lambda a: a.count("/api/v1/nodes"))
    todo = [(node_name(i), slurm_name(i)) for i in range(have, nodes)]
    objects = (node_object(name, {SLURM_LABEL: slurm}) for name, slurm in todo)
    loaded = api.run(lambda a: create_all(a, "nodes", "/api/v1/nodes", objects))
    return {"nodes_before": have, **loaded}


def prepare_slurm(slurm: SlurmCluster, down: int) -> None:
    """The never-registering nodes sized as if registered and set DOWN now, so no state
    change of theirs (UNKNOWN, then DOWN after SlurmdTimeout) lands among the samples."""
    size_scale_nodes(slurm, down)
    hosts = f"s[1-{down}]"
    slurm.run("scontrol", "update", f"nodename={hosts}", "state=down", "reason=bench-no-slurmd")
    for name in LIVE[1:]:  # an interrupted run may have left one drained
        slurm.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)


def measure(nodes: int, plane: ControlPlane, api: Api, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": nodes, "slurm_nodes_down": nodes - len(LIVE)}
    say(f"{nodes} nodes: Kubernetes Nodes")
    result["load"] = load_nodes(api, nodes)
    last = nodes == max(int(n) for n in args.nodes.split(","))
    say(f"{nodes} nodes: Slurm cluster")
    rundir, port = str(RUNDIR / "slurm"), args.slurm_port_base
    t0 = time.monotonic()
    with scale_cluster(
        nodes - len(LIVE), rundir, port, cache=CACHE, live=len(LIVE), keep=args.keep and last
    ) as slurm:
        result["slurm_up_s"] = round(time.monotonic() - t0, 1)
        prepare_slurm(slurm, nodes - len(LIVE))
        result["slurm"] = slurm.release
        env = {**slurm.service_env, "NODELEDGER_SLURM_TIMEOUT": "120"}
        if args.hints:
            env["NODELEDGER_SLURM_FULL_SYNC_INTERVAL"] = "600"
        env |= dict(kv.split("=", 1) for kv in args.service_env)
        database = migrated(f"sqlite:///{RUNDIR}/ledger-{nodes}-{int(time.time())}.db")
        run = Run(nodes, plane, slurm, database, args, env)
        order = modes(args.rounds)
        cycles = max(1, math.ceil(args.samples / order.count("on")))
        with sides(slurm, plane.kubeconfig, args.limit) as s:
            say(f"{nodes} nodes: cold start")
            result["cold_start"] = cold_start(run, s)
            for index, mode in enumerate(order):
                say(f"{nodes} nodes: phase {index} ({mode})")
                phase(run, mode, s, index, cycles)
        result |= results(run)
    return result


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--nodes", default="500,15000", help="sizes, ascending (e.g. 500,5000,15000)")
    add("--samples", type=int, default=40, help="cycles timed per size (each: all four)")
    add("--rounds", type=int, default=2, help="on/off pairs of phases, alternated")
    add("--admission-rate", type=float, default=10.0, help="admissions per s beside")
    add("--min-admissions", type=int, default=200, help="admissions per phase, at least")
    add("--off-wait", type=float, default=1.0, help="seconds per step when off, before on")
    add("--limit", type=float, default=120.0, help="seconds before a propagation is not seen")
    add("--cold-status-qps", type=float, default=500.0, help="status writes/s, first start")
    add("--ready-timeout", type=float, default=1800.0)
    add("--kube-port-base", type=int, default=26379)
    add("--slurm-port-base", type=int, default=26600)
    add("--keep", action="store_true", help="leave the clusters up (the largest size's)")
    add("--hints", action=argparse.BooleanOptionalAction, default=True,
        help="slurmctld's job and node hints, the full listing every 600 s")  # fmt: skip
    add("--service-env", action="append", default=[], metavar="KEY=VALUE",
        help="one more environment variable of the service (e.g. a setting tried)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    sizes = sorted(int(n) for n in args.nodes.split(","))
    # A SIGTERM (timeout, kill) unwinds like ^C: the finally blocks stop the service and
    # the clusters (a background job ignores SIGINT).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    RUNDIR.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(RUNDIR / "kube", args.kube_port_base)
    say("control plane up")
    plane.up()
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average_start": os.getloadavg()},
        "service_env": args.service_env,
        "hints": args.hints,
        "sizes": {},
    }
    try:
        plane.kubectl("apply", "-f", str(CRD))
        plane.kubectl("wait", "--for=condition=Established", "crd/genericnodes.nodeledger.io")
        api = Api(plane.kubeconfig, 32)
        for nodes in sizes:
            report["sizes"][str(nodes)] = measure(nodes, plane, api, args)
    except Exception as exc:
        # The sizes measured so far are printed all the same (a larger one may not fit).
        report["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if not args.keep:
            plane.down()
        report["machine"]["load_average_end"] = os.getloadavg()
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
