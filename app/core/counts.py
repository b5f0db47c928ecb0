"""How much of a Slurm node is left to Slurm jobs once Kubernetes has its share. Pure.

Kubernetes holdings are converted to Slurm's units rounding UP (whole CPUs, MiB), so the
counts left to Slurm never let a job overlap a pod: k8scpu = CPUs - ceil(millicores/1000),
k8smemory = usable MB - ceil(bytes/MiB), k8sgpu = GPUs - held GPUs, each kept within
[0, the node's size].

The same amounts are also written into the node's ``extra`` field (what Kubernetes holds),
so the node_features/k8s_resources plugin restores the lowered counts when the node
re-registers: as the keys ``nodeledger_k8scpu``, ``nodeledger_k8smemory`` and
``nodeledger_k8sgpu`` of a JSON object (others' keys kept), or, beside a site's text of
another form, as the token ``nodeledger=k8scpu:C,k8smemory:M,k8sgpu:G``. Jobs queue behind
pods (``marked``): the object also carries ``"nodeledger": 1``, the key the job_submit
plugin's extra constraint names (docs/slurm.md#jobs-wait-for-what-pods-hold).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from app.core.gres import gres_count, parse_gres, with_counts
from app.core.headroom import held
from app.core.records import NodeView
from app.core.resources import Resources
from app.core.slurm_models import LedgerHolds, SlurmJob, SlurmNode

MIB = 1024 * 1024
EXTRA_TOKEN = "nodeledger="
EXTRA_KEY = "nodeledger"  # the JSON form's marker; its amounts are nodeledger_k8scpu, ...
_KEYS = f"{EXTRA_KEY}_"


@dataclass(frozen=True, slots=True)
class SlurmUnits:
    """Kubernetes holdings expressed in what Slurm counts."""

    cpus: int
    memory_mb: int
    gpus: int

    @classmethod
    def of(cls, held: Resources) -> SlurmUnits:
        return cls(-(-held.cpu_millis // 1000), -(-held.memory_bytes // MIB), held.gpus)

    def as_resources(self) -> Resources:
        return Resources(self.cpus * 1000, self.memory_mb * MIB, self.gpus)

    def at_least(self, other: SlurmUnits) -> SlurmUnits:
        return SlurmUnits(
            max(self.cpus, other.cpus),
            max(self.memory_mb, other.memory_mb),
            max(self.gpus, other.gpus),
        )


@dataclass(frozen=True, slots=True)
class K8sCounts:
    k8scpu: int
    k8smemory: int
    k8sgpu: int | None  # None: the node has no GPUs, so no k8sgpu entry

    def as_dict(self) -> dict[str, int]:
        counts = {"k8scpu": self.k8scpu, "k8smemory": self.k8smemory}
        if self.k8sgpu is not None:
            counts["k8sgpu"] = self.k8sgpu
        return counts


def _within(value: int, size: int) -> int:
    return max(0, min(value, size))


def node_gpus(node: SlurmNode) -> int:
    return gres_count(node.gres, "gpu")


def desired_counts(node: SlurmNode, held: SlurmUnits) -> K8sCounts:
    gpus = node_gpus(node)
    has_gpu_entry = gpus > 0 or any(e.name == "k8sgpu" for e in parse_gres(node.gres))
    return K8sCounts(
        k8scpu=_within(node.cpus - held.cpus, node.cpus),
        k8smemory=_within(node.usable_memory_mb - held.memory_mb, node.usable_memory_mb),
        k8sgpu=_within(gpus - held.gpus, gpus) if has_gpu_entry else None,
    )


def current_counts(node: SlurmNode) -> K8sCounts:
    """What Slurm has now (a count Slurm dropped from the string because it is 0 is 0)."""
    has_gpu_entry = node_gpus(node) > 0 or "k8sgpu" in node.gres
    return K8sCounts(
        k8scpu=gres_count(node.gres, "k8scpu"),
        k8smemory=gres_count(node.gres, "k8smemory"),
        k8sgpu=gres_count(node.gres, "k8sgpu") if has_gpu_entry else None,
    )


def gres_update(node: SlurmNode, counts: K8sCounts) -> str:
    return with_counts(node.gres, counts.as_dict())


def extra_with_holdings(extra: str, held: SlurmUnits, *, marked: bool = False) -> str:
    """``extra`` with what Kubernetes holds written in, what others wrote kept.

    Empty or a JSON object, it is written as a JSON object, our keys replaced and the
    marker added when ``marked`` (jobs queue behind pods): with
    SchedulerParameters=extra_constraints slurmctld refuses any other Extra (error 2171,
    "Invalid extra constraints specification"). A site's text of another form gets our
    token among its tokens. Nothing of ours when nothing is held and not ``marked``."""
    tokens = [t for t in extra.split() if not t.startswith(EXTRA_TOKEN)]
    # The text as it is first (a site's JSON keeps its strings' spaces), then without the
    # token an earlier release wrote.
    fields = _json_object(extra)
    fields = _json_object(" ".join(tokens)) if fields is None else fields
    nothing = held == SlurmUnits(0, 0, 0)
    if fields is not None:
        kept = {k: v for k, v in fields.items() if k != EXTRA_KEY and not k.startswith(_KEYS)}
        marker = {EXTRA_KEY: 1} if marked else {}
        amounts = {} if nothing else {
            f"{_KEYS}k8scpu": held.cpus,
            f"{_KEYS}k8smemory": held.memory_mb,
            f"{_KEYS}k8sgpu": held.gpus,
        }  # fmt: skip
        written = kept | marker | amounts
        return json.dumps(written, separators=(",", ":")) if written else ""
    if not nothing:
        tokens.append(
            f"{EXTRA_TOKEN}k8scpu:{held.cpus},k8smemory:{held.memory_mb},k8sgpu:{held.gpus}"
        )
    return " ".join(tokens)


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object ({} when empty); None when it is anything else."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def in_place(node: SlurmNode, held: SlurmUnits, *, marked: bool = False) -> bool:
    """Whether Slurm already withholds ``held`` on ``node``: its counts, and what ``extra``
    says for the plugin (and, ``marked``, for jobs' extra constraints)."""
    return current_counts(node) == desired_counts(node, held) and node.extra == (
        extra_with_holdings(node.extra, held, marked=marked)
    )


def withheld(view: NodeView) -> SlurmUnits:
    """What Slurm must not give to jobs on this node: every holding that is not a Slurm
    job's own (Kubernetes pods and manual reservations), plus the node's headroom
    (app.core.headroom).

    And every GPU of it while it is not admissible (Slurm says DOWN, DRAIN, ..., or a GPU
    pod's hold job is gone: app.core.plan) and pods hold GPU devices there: the hold jobs
    are gone or may go, and on a node that comes back Slurm starts queued jobs at once on
    the lowest free device, a pod's included. With ``k8sgpu`` at 0 those jobs are held back
    (tests/slurm/test_queued_jobs.py) until the holds are back (app.slurm.hold_sweep)."""
    units = SlurmUnits.of(held(view) + view.headroom.target)
    if view.health_reason is not None and any(h.devices for h in view.holdings):
        return replace(units, gpus=max(units.gpus, view.spec.capacity.gpus))
    return units


def fence_kept(
    view: NodeView, held: SlurmUnits, node: SlurmNode, listed: SlurmNode | None
) -> SlurmUnits:
    """``held`` (withheld), or every GPU of the node while Slurm withholds them all
    (``k8sgpu`` 0 as ``node`` was just read) beside a pod's GPU devices: the
    prep/k8s_gpu_fence plugin sets that the moment a hold job ends, and the ledger learns
    of the end only at its next listing. So a push never gives those GPUs back unless that
    listing already found them withheld (``listed``: the node as it read it, its jobs
    read after), whose plan then knows whether every hold is there (app.core.plan)."""
    gpus = view.spec.capacity.gpus
    if held.gpus >= gpus or not any(h.devices for h in view.holdings):
        return held
    if current_counts(node).k8sgpu != 0:
        return held
    if listed is not None and current_counts(listed).k8sgpu == 0:
        return held
    return replace(held, gpus=gpus)


def held_units(view: NodeView) -> SlurmUnits:
    """What pods and manual reservations hold, in Slurm's units (no headroom)."""
    return SlurmUnits.of(held(view))


def slurm_grant(node: SlurmNode, used: SlurmUnits | None = None) -> Resources:
    """What Slurm withholds on ``node`` that none of its jobs uses, as read: per resource,
    size - max(the k8s count, what jobs use of it), in base units. Jobs can never take it
    while those counts stay: a job needs k8s counts beyond what jobs already use.
    ``used``: what jobs use there (slurm_usage), when the node's own GRES cannot show it."""
    counts = current_counts(node)
    used = gres_usage(node) if used is None else used
    gpus = node_gpus(node)
    return Resources(
        max(0, node.cpus - max(counts.k8scpu, used.cpus)) * 1000,
        max(0, node.usable_memory_mb - max(counts.k8smemory, used.memory_mb)) * MIB,
        max(0, gpus - max(counts.k8sgpu or 0, used.gpus)) if counts.k8sgpu is not None else 0,
    )


def read_back_grant(view: NodeView, node: SlurmNode, used: SlurmUnits) -> Resources:
    """The node's grant (app.core.headroom) once a push read ``node`` back (its jobs using
    ``used``): what Slurm now leaves to pods. Raised only on a node with a headroom target;
    without one it can only fall (every admission there goes through the gate, which needs
    no grant)."""
    now = slurm_grant(node, used)
    return view.headroom.granted.at_most(now) if view.headroom.target.is_zero() else now


def gres_usage(node: SlurmNode) -> SlurmUnits:
    """What Slurm's jobs use on ``node``, from its GRES accounting: every job asks for
    k8scpu/k8smemory/k8sgpu equal to its allocation (job_submit/k8s_resource_completion), and
    slurmctld counts them when the job starts, under the same lock as a node update
    (app.slurm.gate has the whole argument). GPUs: k8sgpu in use, not gpu: a GPU hold job
    (app.slurm.holds) has its pod's devices but no k8s GRES, since the counts withhold that
    pod already; counting its devices again would call every held pod an overlap."""
    used = node.gres_used
    return SlurmUnits(
        gres_count(used, "k8scpu"), gres_count(used, "k8smemory"), gres_count(used, "k8sgpu")
    )


def hides_usage(node: SlurmNode) -> bool:
    """Whether a k8s count of ``node`` is 0. Slurm then leaves that GRES out of both the
    node's ``gres`` and ``gres_used``, though it still counts what its jobs use of it: a
    job's k8scpu:2 vanished from GresUsed at a k8scpu total of 0 and came back at 16
    (26.05.3). Its jobs' use must then be read from the jobs (slurm_usage)."""
    counts = current_counts(node)
    return counts.k8scpu == 0 or counts.k8smemory == 0 or counts.k8sgpu == 0


def slurm_usage(node: SlurmNode, jobs: Iterable[SlurmJob], holds: LedgerHolds) -> SlurmUnits:
    """What Slurm's jobs use on ``node``: its GRES accounting, and where a count of 0 hides
    that (hides_usage), at least what ``jobs`` (listed after ``node`` was read) hold there.
    The ledger's hold jobs (``holds``) are pods, withheld by the counts already; any other
    job counts, whatever its name."""
    used = gres_usage(node)
    if not hides_usage(node):
        return used
    held = [
        h
        for job in jobs
        if job.holds_resources and not holds.owns(job)
        if (h := job_on(job, node.name)) is not None
    ]
    return used.at_least(SlurmUnits.of(Resources.total(held)))


def job_on(job: SlurmJob, node: str) -> Resources | None:
    """What ``job`` holds on ``node``; None when it holds nothing there."""
    for a in job.allocations:
        if a.node == node:
            return Resources(a.cpus * 1000, a.memory_mb * MIB, a.gpus)
    return None


def slurm_overlap(node: SlurmNode, used: SlurmUnits, held: SlurmUnits) -> list[str]:
    """Where Slurm already ``used`` more than it is left once ``held`` is withheld (a job
    that started before the lowered counts landed). Empty when the hold is safe."""
    problems = []
    if used.cpus > node.cpus - held.cpus:
        problems.append(
            f"cpu: Slurm uses {used.cpus} of {node.cpus} CPUs, Kubernetes needs {held.cpus}"
        )
    if used.memory_mb > node.usable_memory_mb - held.memory_mb:
        problems.append(
            f"memory: Slurm uses {used.memory_mb} of {node.usable_memory_mb} MB, "
            f"Kubernetes needs {held.memory_mb}"
        )
    gpus = node_gpus(node)
    if held.gpus and used.gpus > gpus - held.gpus:
        problems.append(f"gpu: Slurm uses {used.gpus} of {gpus} GPUs, Kubernetes needs {held.gpus}")
    return problems


def node_size(node: SlurmNode) -> Resources:
    """A Slurm node's size as the ledger counts it: CPUs, usable memory, GPUs."""
    return Resources(node.cpus * 1000, node.usable_memory_mb * MIB, node_gpus(node))
