"""The checks once the load has stopped and one resync has passed: the ledger against what
the clients were told, and Slurm's counts against the ledger."""

from __future__ import annotations

import json
from typing import Any

from bench.chaos.slurm import NodeCounts
from bench.chaos.workload import Book

MIB = 1024**2


def holdings_check(book: Book, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Lost: the clients were told admitted (and not released) but the ledger has no such
    pod, at the end or when the client released it (``release_found_nothing``). Leaked:
    the ledger holds a pod the clients were told rejected or released, or never asked
    for. Unknown: a request never got a final answer; either outcome is fine, and the
    counts check below proves Slurm agrees with whichever the ledger has."""
    pods = {r["holder"]["id"]: r for r in rows if r["holder"]["kind"] == "pod"}
    expected = {uid: pod for uid, pod in book.admitted.items() if uid not in book.released}
    lost = sorted(set(expected) - set(pods) - set(book.unknown))
    leaked = sorted(set(pods) - set(expected) - set(book.unknown))
    wrong = sorted(
        uid
        for uid, pod in expected.items()
        if uid in pods
        and (
            pods[uid]["node"],
            pods[uid]["requests"]["cpu_millis"],
            pods[uid]["requests"]["memory_bytes"],
        )
        != (pod.node, pod.cpu_millis, pod.memory_bytes)
    )
    pending = sorted(uid for uid, r in pods.items() if r["state"] != "held")
    return {
        "admitted_during_run": len(book.admitted),
        # Every release of an admitted pod checked it was still held: 200, or 404 only
        # when an earlier attempt's answer was lost (the killed replica released it).
        "release_found_nothing": book.counts["release_http_404"],
        "expected_held": len(expected),
        "ledger_pods": len(pods),
        "lost": lost,
        "leaked": leaked,
        "wrong_amounts": wrong,
        "pending": pending,
        "unknown": {uid: "held" if uid in pods else "absent" for uid in sorted(book.unknown)},
    }


def withheld(node: dict[str, Any]) -> tuple[int, int, int]:
    """What the ledger withholds from Slurm (app/core/counts.py): pods and manual
    reservations, in whole CPUs and MB rounded up, and GPUs."""
    k8s, manual = node["held_by_kubernetes"], node["held_manually"]
    millis = k8s["cpu_millis"] + manual["cpu_millis"]
    nbytes = k8s["memory_bytes"] + manual["memory_bytes"]
    return -(-millis // 1000), -(-nbytes // MIB), k8s["gpu"] + manual["gpu"]


def desired(size: NodeCounts, held: tuple[int, int, int]) -> dict[str, int | None]:
    """The counts the README says Slurm must have: the node minus what is withheld."""
    cpus, mb, gpus = held
    return {
        "k8scpu": max(0, min(size.cpus, size.cpus - cpus)),
        "k8smemory": max(0, min(size.memory_mb, size.memory_mb - mb)),
        "k8sgpu": max(0, min(size.gpus, size.gpus - gpus)) if size.k8sgpu is not None else None,
    }


def extra_held(extra: str) -> tuple[int, int, int] | None:
    """What the node's ``extra`` says Kubernetes holds (None: nothing of the service's):
    the keys ``nodeledger_k8scpu``... of a JSON object, or the ``nodeledger=`` token."""
    if extra.strip().startswith("{"):
        fields = json.loads(extra)
        keys = ("nodeledger_k8scpu", "nodeledger_k8smemory", "nodeledger_k8sgpu")
        if not any(k in fields for k in keys):
            return None
        cpus, mb, gpus = (int(fields.get(k, 0)) for k in keys)
        return cpus, mb, gpus
    for token in extra.split():
        if token.startswith("nodeledger="):
            amounts = dict(e.split(":") for e in token.removeprefix("nodeledger=").split(","))
            return int(amounts["k8scpu"]), int(amounts["k8smemory"]), int(amounts["k8sgpu"])
    return None


def counts_check(slurm: dict[str, NodeCounts], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for node in nodes:
        size = slurm[node["slurm_name"] or node["name"]]
        held = withheld(node)
        want = desired(size, held)
        have = {"k8scpu": size.k8scpu, "k8smemory": size.k8smemory, "k8sgpu": size.k8sgpu}
        result[node["name"]] = {
            "counts_match": have == want,
            "extra_token_match": extra_held(size.extra) == (None if held == (0, 0, 0) else held),
            "slurm": have,
            "ledger_wants": want,
            "slurm_extra": size.extra,
            "held_by_slurm_cpu_millis": node["held_by_slurm"]["cpu_millis"],
        }
    return result
