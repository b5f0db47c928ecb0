"""What a race against the real Slurm cluster checks: Slurm's use of a node, the
invariant that pods and jobs never oversubscribe it, and the headroom's own checks."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.slurm.helpers import events
from tests.support.slurm_cluster import SlurmCluster, wait_until

NODE = "n1"


def slurm_use(slurm: SlurmCluster, node: str = NODE) -> tuple[int, int]:
    """CPUs and MB of the jobs running on the node, from squeue: after a slurmctld restart
    the node's own alloc_cpus stays 0 while jobs run, so it cannot be the witness."""
    cpus = mb = 0
    for line in slurm.run("squeue", "-h", "-w", node, "-t", "R,CG", "-o", "%C %m").split("\n"):
        if line.strip():
            c, m = line.split()
            cpus, mb = cpus + int(c), mb + int(m.rstrip("M"))
    return cpus, mb


def check_invariant(api: TestClient, slurm: SlurmCluster) -> None:
    """Kubernetes + Slurm never above the node, seen from both sides."""
    node = api.get(f"/v1/nodes/{NODE}").json()
    pods_millis = node["held_by_kubernetes"]["cpu_millis"]
    pods_mb = -(-node["held_by_kubernetes"]["memory_bytes"] // 2**20)
    used_cpus, used_mb = slurm_use(slurm)
    gres = slurm.node(NODE)["gres"]
    state = (
        f"Slurm jobs {used_cpus} CPUs {used_mb} MB, gres {gres}; pods {pods_millis}m {pods_mb} MB"
    )
    assert used_cpus + -(-pods_millis // 1000) <= 16, state
    assert used_mb + pods_mb <= 32000, state
    # Once the sync has caught up, the ledger's own sums are within capacity too. Jobs that
    # pended behind this round's keep starting and ending for a few seconds, and each change
    # reaches the ledger one sync later: wait for a quiet moment, not a fixed few seconds.
    seen: list[str] = []

    def caught_up() -> bool:
        ledger = api.get(f"/v1/nodes/{NODE}").json()["held_by_slurm"]["cpu_millis"]
        used = slurm_use(slurm)[0] * 1000
        seen.append(f"ledger {ledger}m, Slurm {used}m")
        return bool(ledger == used)

    try:
        wait_until(caught_up, 30, interval=0.2, what="ledger caught up with Slurm")
    except AssertionError as exc:
        queue = slurm.run("squeue", "-h", "-w", NODE, "-o", "%i %T %C")
        raise AssertionError(f"{exc}; last seen {seen[-3:]}; queue {queue!r}") from exc
    assert api.get(f"/v1/nodes/{NODE}").json()["free"]["cpu_millis"] >= 0


def within(api: TestClient, node: str) -> list[str]:
    """The pods admitted inside the node's headroom, from the ledger's events."""
    return [
        e["holder_id"] for e in events(api, node, "admitted") if e["details"].get("within_headroom")
    ]


def sync_check(api: TestClient) -> str:
    """The sync's line in /readyz."""
    return str(api.get("/readyz").json()["checks"].get("slurm", ""))
