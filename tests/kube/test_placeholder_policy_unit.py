"""Placeholder pods against cluster policy, with fakes: their shape passes Pod Security
"restricted" and a LimitRange, and a create or resize the API server refuses is tried again
with a backoff, and keeps its node from the chart's scheduler (a Node label), in /readyz
and in a metric once it has lasted REFUSED_BOUND. The real API server:
tests/kube/test_placeholder_policy.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.core import placeholder
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.kube.client import KubeError
from app.kube.controllers.placeholders import REFUSED_BOUND, Placeholders
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from tests.support.placeholders import GIB, NODE, FakePods, one_pass

FORBIDDEN = 'pods "nodeledger-held-a" is forbidden: violates PodSecurity "restricted:latest"'


def test_the_pod_passes_pod_security_restricted_and_any_limit_range() -> None:
    pod = placeholder.pod("kn1", "u", Resources(1500, GIB), namespace="nl", image="pause")
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65535,
        "runAsGroup": 65535,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    [container] = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    resources = container["resources"]
    assert resources["limits"] == resources["requests"]  # nothing for a LimitRange to add
    # The shape the chart's admission policy allows: no token, volume, host namespace or
    # other ServiceAccount, one container of the image.
    assert spec["automountServiceAccountToken"] is False
    assert not {"volumes", "serviceAccountName", "hostNetwork", "hostPID", "hostIPC"} & set(spec)
    assert not {"command", "args", "env", "envFrom", "volumeMounts"} & set(container)
    assert container["image"] == "pause"


class FakeApi(FakePods):
    """FakePods, and the Nodes' refused label; ``refuse``: what every create or resize of a
    placeholder raises (None: they go through)."""

    def __init__(self) -> None:
        super().__init__()
        self.labelled: set[str] = set()
        self.refuse: KubeError | None = None

    def request(self, method: str, path: str, *, body: Any = None, **kw: Any) -> dict[str, Any]:
        if path.startswith("/api/v1/nodes/"):
            node = path.rsplit("/", 1)[-1]
            self.calls.append((method, node))
            value = body["metadata"]["labels"][placeholder.REFUSED_LABEL]
            (self.labelled.add if value == "true" else self.labelled.discard)(node)
            return {}
        if self.refuse is not None and method in ("POST", "PATCH"):
            self.calls.append((method, "refused"))
            raise self.refuse
        return super().request(method, path, body=body, **kw)

    def list(self, path: str, decode: Any, shape: Any = None, **query: Any) -> Any:
        if path == "/api/v1/nodes":
            assert query == {"labelSelector": f"{placeholder.REFUSED_LABEL}=true"}
            return [decode({"metadata": {"name": n}}) for n in sorted(self.labelled)], "1"
        return super().list(path, decode, shape, **query)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(ledger: Ledger, api: FakeApi, clock: Clock, metrics: Metrics) -> Placeholders:
    return Placeholders(
        NodeSnapshot(ledger), api, lambda n: (NODE, f"uid-{n}"),  # type: ignore[arg-type]
        None, namespace="nl", image="pause", qps=1000, burst=1000, metrics=metrics,
        monotonic=clock,
    )  # fmt: skip


def step(placeholders: Placeholders) -> list[tuple[str, str]]:
    """One pass; its calls."""
    calls: list[tuple[str, str]] = placeholders.client.calls  # type: ignore[attr-defined]
    before = len(calls)
    one_pass(placeholders)
    return calls[before:]


@pytest.fixture
def refused(ledger: Ledger) -> tuple[Placeholders, FakeApi, Clock, Metrics]:
    ledger.upsert_node("a", NodeSpec(capacity=NODE))
    ledger.upsert_node("b", NodeSpec(capacity=NODE))
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(4000, GIB))
    api, clock, metrics = FakeApi(), Clock(), Metrics(CollectorRegistry())
    placeholders = controller(ledger, api, clock, metrics)
    placeholders.snapshot.subscribe(placeholders.mark)
    placeholders.resync([])
    placeholders.find_labelled()
    return placeholders, api, clock, metrics


def gauge(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("nodeledger_kube_placeholders_refused")


def test_a_refused_placeholder_keeps_its_node_from_the_scheduler_within_the_bound(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    placeholders, api, clock, metrics = refused
    api.refuse = KubeError(f"POST pods: 403 {FORBIDDEN}", 403)
    caplog.set_level(logging.WARNING)
    assert step(placeholders) == [("POST", "refused")]  # said, not raised
    assert step(placeholders) == []  # no loop at the write rate: tried again after 1 s
    clock.now += 1
    assert step(placeholders) == [("POST", "refused")]
    clock.now += 2
    assert step(placeholders) == [("POST", "refused")]  # then after 2 s, 4 s, ...
    assert (api.labelled, placeholders.refusals, gauge(metrics)) == (set(), None, 0)
    clock.now += REFUSED_BOUND - 3  # the bound since the first refusal
    assert ("PATCH", "a") in step(placeholders)
    assert api.labelled == {"a"}  # the chart's scheduler's node affinity keeps pods off
    assert placeholders.refusals is not None
    assert "on 1 node(s)" in placeholders.refusals
    assert FORBIDDEN in placeholders.refusals
    assert gauge(metrics) == 1
    assert sum("refused, tried again" in r.message for r in caplog.records) == 1
    # The policy is lifted: the next try creates it, and the node is back.
    api.refuse = None
    clock.now += 60
    assert step(placeholders) == [("POST", "nodeledger-held-a"), ("PATCH", "a")]
    assert (api.labelled, placeholders.refusals, gauge(metrics)) == (set(), None, 0)
    assert api.requests("a") == {"cpu": "4000m", "memory": str(GIB)}


def test_a_node_that_needs_no_placeholder_any_more_is_back_at_once(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], ledger: Ledger
) -> None:
    placeholders, api, clock, _ = refused
    api.refuse = KubeError(f"POST pods: 403 {FORBIDDEN}", 403)
    step(placeholders)
    clock.now += REFUSED_BOUND
    step(placeholders)
    assert api.labelled == {"a"}
    ledger.release("m1", HolderKind.MANUAL)
    assert step(placeholders) == [("PATCH", "a")]
    assert api.labelled == set()


def test_a_refused_resize_is_made_again_at_its_size(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], ledger: Ledger
) -> None:
    """A resize the API server refuses (a change of QoS class, as limits equal requests, when
    CPU or memory crosses zero; a placeholder of an older shape): deleted, and made again
    on its DELETED event."""
    placeholders, api, clock, _ = refused
    assert step(placeholders) == [("POST", "nodeledger-held-a")]
    ledger.admit("a", Holder(HolderKind.MANUAL, "m2"), Resources(1000, 0))
    api.refuse = KubeError("PATCH pods/resize: 422 Pod QOS Class may not change", 422)
    assert step(placeholders) == [("PATCH", "refused"), ("DELETE", "nodeledger-held-a")]
    api.refuse = None
    body = api.pods.get("nodeledger-held-a") or placeholder.pod("a", "", NODE, namespace="nl",
                                                                 image="pause")  # fmt: skip
    placeholders.on_event("DELETED", placeholders.decode(body))
    clock.now += 1
    assert step(placeholders) == [("POST", "nodeledger-held-a")]
    assert api.requests("a") == {"cpu": "5000m", "memory": str(GIB)}
    assert placeholders._refused == {}


def test_an_outage_is_no_refusal_and_a_former_leaders_label_goes(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], ledger: Ledger
) -> None:
    placeholders, api, _, _ = refused
    api.refuse = KubeError("POST pods: connection refused", None)
    with pytest.raises(KubeError):  # the run loop's log_failure: one DEBUG line an outage
        step(placeholders)
    assert placeholders._refused == {}
    # A Node labelled by the last leader, whose placeholder is fine now.
    api.refuse = None
    api.labelled.add("b")
    placeholders.find_labelled()
    assert sorted(step(placeholders)) == [("PATCH", "b"), ("POST", "nodeledger-held-a")]
    assert api.labelled == set()
