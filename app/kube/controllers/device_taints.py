"""Slurm jobs' GPU devices as DeviceTaintRules (app.core.device_taints decides).

Leader-only, like maintenance. Each time the Slurm sync publishes a new job listing (the
jobs-by-node map is replaced whole, so a new object is news), and every ``resync_period``,
it lists its own rules (label ``MANAGED_BY``), computes the wanted ones and creates,
updates and deletes the difference. A new leader starts from that list: nothing is kept
across terms.

Fail closed: while the Slurm sync's last read failed (``jobs`` answers None) nothing is
written; a failed read is not "no jobs". Turned off (or Slurm off), it deletes every rule
of ours once per term and writes nothing else; without GPU drivers it reads nothing at all.
The API is checked once per term: Kubernetes without DeviceTaintRule in resource.k8s.io/v1
(before 1.37; 1.36's opt-in v1beta2 is not used) gets no taints, said in one log line and in
``note`` (the component's health, hence /readyz).

A device's identity (Slurm index -> driver/pool/device) is read from the node's slices the
first time a job holds a device there, and read again after every resync.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from app.core.device_taints import (
    RULES_PATH,
    Carried,
    DeviceId,
    WantedRule,
    carried_of,
    identity,
    plan,
    rule_body,
    rule_spec,
    wanted_rules,
)
from app.core.genericnode import MANAGED_BY
from app.core.slurm_models import LedgerHolds, SlurmJob
from app.kube.client import KubeClient, KubeError
from app.loops import Loop, Stop

log = logging.getLogger(__name__)
POLL = 0.5  # seconds between looks for a new Slurm listing
SlurmJobs = Callable[[], Mapping[str, Mapping[str, SlurmJob]] | None]
HoldsOf = Callable[[], LedgerHolds]  # the ledger's hold jobs, as its read model has them
_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


class DeviceTaints:
    def __init__(
        self,
        client: KubeClient,
        nodes: Callable[[], Mapping[str, str]],
        jobs: SlurmJobs,
        holds: HoldsOf,
        *,
        drivers: Collection[str],
        attribute: str,
        enabled: bool,
        resync_period: float,
    ) -> None:
        """``nodes``: Slurm node -> Kubernetes node, the ledger's; ``jobs``: the sync's jobs
        by Slurm node as last listed, None while its last read failed or before the first;
        ``holds``: which of them are the ledger's hold jobs (pods' devices: no taint)."""
        self.client = client
        self.holds = holds
        self.nodes = nodes
        self.jobs = jobs
        self.drivers = frozenset(drivers)
        self.attribute = attribute
        self.enabled = enabled and bool(self.drivers)
        self.resync_period = resync_period
        self.served: bool | None = None  # DeviceTaintRule in resource.k8s.io/v1; None: unknown
        self.note: str | None = None  # what it falls back to, for /readyz
        self.error: str | None = None
        self.skipped: list[str] = []
        self._identities: dict[str, dict[int, DeviceId]] = {}
        self._seen: object = None  # the jobs map last reconciled
        self._seen_holds: LedgerHolds | None = None  # and the ledger's holds then
        self._resynced: float | None = None
        self._cleaned = False
        # Per Kubernetes node, the devices our rules taint as last written (index -> job
        # id, rule): status.gpus lists them; ``changed`` hears of the nodes that changed.
        self.applied: dict[str, dict[int, tuple[str, str]]] = {}
        self.changed: Callable[[Collection[str]], None] = lambda _nodes: None
        self._loop = Loop("device-taints", self.step, interval=POLL, logger=log,
                          what="GPU device taints")  # fmt: skip

    def run(self, stop: Stop) -> None:
        """Reconcile until ``stop`` (the leadership term's); a new term starts afresh."""
        self.served, self._seen, self._resynced, self._cleaned = None, None, None, False
        self._loop.run(stop)

    def step(self) -> None:
        if not self.drivers:
            return  # no co-managed GPUs: no DRA object is read (turn taints off first)
        try:
            self._step()
        except KubeError as exc:  # a list refused (RBAC) or failed: said once, retried
            if str(exc) != self.error:
                log.warning("GPU device taints: %s", exc)
            self.error = str(exc)

    def _step(self) -> None:
        if self.served is None:
            self.served = self._detect()
            self.error = None
        if not self.served:
            return
        if not self.enabled:
            if not self._cleaned:
                self._delete_all()
            return
        jobs = self.jobs()
        if jobs is None:
            return  # Slurm not read (yet, or its read failed): keep every taint
        # A hold listed before its admission recorded it was a Slurm job's: news too.
        holds = self.holds()
        now = time.monotonic()
        resync = self._resynced is None or now - self._resynced > self.resync_period
        if jobs is self._seen and holds == self._seen_holds and not resync:
            return
        if resync:
            self._identities = {}
        self.reconcile(jobs, holds)
        self._seen = jobs if self.error is None else None  # a failed write: try again
        self._seen_holds = holds
        if resync:
            self._resynced = now

    def reconcile(self, by_node: Mapping[str, Mapping[str, SlurmJob]], holds: LedgerHolds) -> None:
        """Bring our rules to what the listing ``by_node`` wants, ``holds`` its pods' holds."""
        jobs = list({j.job_id: j for m in by_node.values() for j in m.values()}.values())
        nodes = self.nodes()
        held = {nodes[a.node] for j in jobs for a in j.allocations if a.devices and a.node in nodes}
        identities = {node: self._identity(node) for node in sorted(held)}
        wanted, skipped = wanted_rules(jobs, nodes, identities, holds)
        if skipped and skipped != self.skipped:  # said once, not at every listing
            log.warning("GPU device taints: skipped %s", "; ".join(skipped[:5]))
        self.skipped = skipped
        listed, _ = self.client.list(RULES_PATH, carried_of, labelSelector=_SELECTOR)
        carried: dict[str, Carried | None] = dict(listed)
        todo = plan(wanted, carried)
        failures: list[str] = []
        for rule in todo.create:
            self._write(failures, "POST", RULES_PATH, rule_body(rule), rule.name)
        for rule in todo.update:
            body = {"spec": rule_spec(rule.carried)}
            self._write(failures, "PATCH", f"{RULES_PATH}/{rule.name}", body, rule.name)
        for name in todo.delete:
            self._write(failures, "DELETE", f"{RULES_PATH}/{name}", None, name)
        if not todo.empty:
            log.info(
                "GPU device taints: %d created, %d updated, %d deleted",
                len(todo.create), len(todo.update), len(todo.delete),
            )  # fmt: skip
        self.error = "; ".join(failures[:5]) or None
        self._applied(wanted.values() if not failures else ())

    def tainted(self, node: str) -> Mapping[int, tuple[str, str]]:
        """A node's devices our rules taint (index -> job id, rule), as last written."""
        return self.applied.get(node, {})

    def _applied(self, rules: Iterable[WantedRule]) -> None:
        """Keep what our rules now taint (a failed write: nothing is shown until a
        reconcile succeeds) and tell ``changed`` which nodes differ."""
        applied: dict[str, dict[int, tuple[str, str]]] = {}
        for rule in rules:
            applied.setdefault(rule.node, {})[rule.index] = (rule.carried.job_id, rule.name)
        nodes = {
            n for n in applied.keys() | self.applied.keys() if applied.get(n) != self.applied.get(n)
        }
        self.applied = applied
        if nodes:
            self.changed(nodes)

    def _identity(self, node: str) -> dict[int, DeviceId]:
        if node not in self._identities:
            slices = self.client.resource_slices(node, self.drivers)
            self._identities[node] = identity(slices, node, self.drivers, self.attribute)
        return self._identities[node]

    def _write(self, failures: list[str], method: str, path: str, body: Any, name: str) -> None:
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        try:
            self.client.request(method, path, body=body, content_type=content)
        except KubeError as exc:
            if method == "DELETE" and exc.status == 404:
                return  # gone already
            failures.append(f"DeviceTaintRule {name}: {exc}")

    def _delete_all(self) -> None:
        """Delete every rule of ours (the feature turned off), never another's."""
        listed, _ = self.client.list(RULES_PATH, carried_of, labelSelector=_SELECTOR)
        failures: list[str] = []
        for name, _carried in listed:
            self._write(failures, "DELETE", f"{RULES_PATH}/{name}", None, name)
        if listed:
            log.info("GPU device taints off: %d DeviceTaintRules of ours deleted", len(listed))
        self.error = "; ".join(failures[:5]) or None
        self._cleaned = not failures
        self._applied(())

    def _detect(self) -> bool:
        """Whether the API server serves DeviceTaintRule in resource.k8s.io/v1; when not,
        one log line and ``note`` say what the service falls back to."""
        try:
            found = self.client.request("GET", RULES_PATH.rsplit("/", 1)[0])
            served = any(r.get("name") == "devicetaintrules" for r in found.get("resources", []))
        except KubeError as exc:
            if exc.status != 404:
                raise
            served = False
        if not served:
            self.note = (
                "GPU device taints off: the API server does not serve "
                "resource.k8s.io/v1 DeviceTaintRule (Kubernetes 1.37 or later); falling back "
                "to no taints: a pod may be allocated a device a Slurm job has, then refused "
                "at its bind"
            )
            log.warning("%s", self.note)
        else:
            self.note = None
        return served
