"""The release rule for a pod's holding (app.core.pod_release), table-driven and over every
combination of its inputs: a pod gone from the API while its node is lost keeps its
holding unless something proves its containers stopped, and each release names its proof."""

from __future__ import annotations

import itertools

import pytest

from app.core.pod_release import NodeHealth, Proof, release_proof

READY = NodeHealth(ready=True)
LOST = NodeHealth(ready=False)
LOST_OOS = NodeHealth(ready=False, out_of_service=True)
READY_OOS = NodeHealth(ready=True, out_of_service=True)
NODES: dict[str, NodeHealth | None] = {
    "ready": READY,
    "lost": LOST,
    "lost+oos": LOST_OOS,
    "ready+oos": READY_OOS,
    "deleted": None,
}

CASES = [
    # (id, gone, terminal, stopped, node, orphaned, expected)
    ("present-running-on-ready", False, False, False, READY, False, None),
    ("present-terminating-on-ready", False, False, True, READY, False, None),
    ("present-on-lost-node", False, False, False, LOST, False, None),
    ("present-on-deleted-node", False, False, False, None, False, None),
    ("finished", False, True, True, READY, False, Proof.POD_TERMINAL),
    ("finished-on-lost-node", False, True, False, LOST, False, Proof.POD_TERMINAL),
    ("deleted-finished-on-lost-node", True, True, False, LOST, False, Proof.POD_TERMINAL),
    ("deleted-on-ready-node", True, False, False, READY, False, Proof.POD_DELETED_NODE_READY),
    ("deleted-stopped-on-ready", True, False, True, READY, False, Proof.CONTAINERS_STOPPED),
    ("force-deleted-on-lost-node", True, False, False, LOST, False, None),
    ("force-deleted-stopped-on-lost", True, False, True, LOST, False, Proof.CONTAINERS_STOPPED),
    ("deleted-on-tainted-lost-node", True, False, False, LOST_OOS, False, Proof.OUT_OF_SERVICE),
    ("deleted-on-tainted-ready-node", True, False, False, READY_OOS, False, Proof.OUT_OF_SERVICE),
    ("deleted-node-deleted", True, False, False, None, False, Proof.NODE_DELETED),
    ("orphan-node-still-lost", True, False, False, LOST, True, None),
    ("orphan-kubelet-returned", True, False, False, READY, True, Proof.KUBELET_RETURNED),
    ("orphan-tainted", True, False, False, LOST_OOS, True, Proof.OUT_OF_SERVICE),
    ("orphan-node-deleted", True, False, False, None, True, Proof.NODE_DELETED),
]


@pytest.mark.parametrize(
    ("gone", "terminal", "stopped", "node", "orphaned", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_release_proof(
    gone: bool,
    terminal: bool,
    stopped: bool,
    node: NodeHealth | None,
    orphaned: bool,
    expected: Proof | None,
) -> None:
    proof = release_proof(
        gone=gone, terminal=terminal, stopped=stopped, node=node, orphaned=orphaned
    )
    assert proof == expected


EVERY_INPUT = list(
    itertools.product([False, True], [False, True], [False, True], NODES, [False, True])
)


@pytest.mark.parametrize(
    ("gone", "terminal", "stopped", "node_state", "orphaned"),
    EVERY_INPUT,
    ids=[
        f"{'gone' if g else 'present'}-{'terminal' if t else 'live'}-"
        f"{'stopped' if s else 'running'}-{n}-{'orphaned' if o else 'fresh'}"
        for g, t, s, n, o in EVERY_INPUT
    ],
)
def test_every_input_released_only_with_its_proof(
    gone: bool, terminal: bool, stopped: bool, node_state: str, orphaned: bool
) -> None:
    node = NODES[node_state]
    proof = release_proof(
        gone=gone, terminal=terminal, stopped=stopped, node=node, orphaned=orphaned
    )
    # The safety claim: a pod gone while its node is lost (not Ready, not tainted, still
    # there), with no word from the pod itself, keeps its holding.
    lost = node is not None and not node.ready and not node.out_of_service
    if not terminal and (not gone or (lost and not stopped)):
        assert proof is None
        return
    assert proof is not None
    # Each proof is a true statement about the inputs, the strongest one first.
    oos = node is not None and node.out_of_service
    holds = {
        Proof.POD_TERMINAL: terminal,
        Proof.CONTAINERS_STOPPED: (gone, stopped, terminal) == (True, True, False),
        Proof.NODE_DELETED: (gone, stopped, node) == (True, False, None),
        Proof.OUT_OF_SERVICE: (gone, stopped, oos) == (True, False, True),
        Proof.POD_DELETED_NODE_READY: (gone, stopped, node, orphaned)
        == (True, False, READY, False),
        Proof.KUBELET_RETURNED: (gone, stopped, node, orphaned) == (True, False, READY, True),
    }
    assert holds[proof]


def test_orphaning_names_the_proof_only() -> None:
    """Whether the holding was kept before changes the name of a proof, never the decision."""
    for gone, terminal, stopped, node_state in itertools.product(
        [False, True], [False, True], [False, True], NODES
    ):
        node = NODES[node_state]
        fresh = release_proof(gone=gone, terminal=terminal, stopped=stopped, node=node)
        kept = release_proof(
            gone=gone, terminal=terminal, stopped=stopped, node=node, orphaned=True
        )
        assert (fresh is None) == (kept is None)
