"""Slurm jobs' GPU devices as DeviceTaintRules (issue 33): the pure decision
(app.core.device_taints) table-tested, and the leader's reconciler
(app.kube.controllers.device_taints) against a fake API server."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from app.core.device_taints import (
    TAINT_KEY,
    Carried,
    DeviceId,
    WantedRule,
    carried_of,
    identity,
    plan,
    rule_body,
    rule_name,
    wanted_rules,
)
from app.core.genericnode import MANAGED_BY, gpus_of
from app.core.records import HeldDevice, Holder, HolderKind, Holding, HoldingState
from app.core.resources import Resources
from app.core.slurm_models import (
    HOLD_JOB_NAME,
    JobAllocation,
    LedgerHolds,
    SlurmJob,
    hold_comment,
)
from app.kube.client import KubeClient, KubeError
from app.kube.controllers.device_taints import RULES_PATH, DeviceTaints

DRIVER = "gpu.example.com"
NODES = {"n3": "gpu-1", "n4": "gpu-2"}  # Slurm -> Kubernetes
HOLDS = LedgerHolds("slurm", frozenset({"9"}))  # the hold jobs the ledger recorded
IDS = {
    node: {i: DeviceId(DRIVER, node, f"gpu{i}") for i in range(4)} for node in ("gpu-1", "gpu-2")
}


def job(job_id: str, node: str = "n3", *devices: int, state: str = "RUNNING") -> SlurmJob:
    allocation = JobAllocation(node, 2, 100, len(devices), tuple(devices))
    return SlurmJob(job_id, "train", "alice", frozenset({state}), (allocation,))


def hold(job_id: str, *devices: int) -> SlurmJob:
    allocation = JobAllocation("n3", 2, 1, len(devices), tuple(devices))
    return SlurmJob(job_id, HOLD_JOB_NAME, "slurm", frozenset({"RUNNING"}), (allocation,),
                    comment=hold_comment("pod-uid"))  # fmt: skip


def rule(node: str, index: int, job_id: str) -> WantedRule:
    return WantedRule(rule_name(node, index), node, index, Carried(IDS[node][index], job_id))


@pytest.mark.parametrize(
    ("jobs", "expected", "skipped"),
    [
        pytest.param([job("7", "n3", 0)], [rule("gpu-1", 0, "7")], 0, id="one-device"),
        pytest.param(
            [job("7", "n3", 0, 2), job("8", "n4", 1)],
            [rule("gpu-1", 0, "7"), rule("gpu-1", 2, "7"), rule("gpu-2", 1, "8")],
            0,
            id="two-jobs-two-nodes",
        ),
        pytest.param([hold("9", 1)], [], 0, id="hold-jobs-are-the-pods"),
        pytest.param([job("7", "n3")], [], 0, id="no-devices"),
        pytest.param([job("7", "n3", 0, state="PENDING")], [], 0, id="pending-holds-nothing"),
        pytest.param([job("7", "n9", 0)], [], 0, id="not-a-co-managed-node"),
        pytest.param([job("7", "n3", 0, 6)], [rule("gpu-1", 0, "7")], 1, id="unknown-index"),
        pytest.param(
            [job("8", "n3", 0), job("7", "n3", 0, state="COMPLETING")],
            [rule("gpu-1", 0, "8")],
            0,
            id="completing-beside-its-successor",
        ),
    ],
)
def test_the_wanted_rules_follow_the_listing(
    jobs: list[SlurmJob], expected: list[WantedRule], skipped: int
) -> None:
    wanted, skips = wanted_rules(jobs, NODES, IDS, HOLDS)
    assert wanted == {r.name: r for r in expected}
    assert len(skips) == skipped
    if skipped:
        assert "device 6 of gpu-1" in skips[0]


def test_a_job_that_ends_takes_its_rule_and_a_device_that_moves_updates_it() -> None:
    before, _ = wanted_rules([job("7", "n3", 0, 1)], NODES, IDS, HOLDS)
    carried = {name: w.carried for name, w in before.items()}
    after, _ = wanted_rules([job("8", "n3", 1)], NODES, IDS, HOLDS)  # 7 ended, 8 got device 1
    todo = plan(after, carried)
    assert todo.create == ()
    assert todo.update == (rule("gpu-1", 1, "8"),)
    assert todo.delete == (rule_name("gpu-1", 0),)
    assert plan(after, {n: w.carried for n, w in after.items()}).empty


def test_a_rule_not_in_our_shape_is_rewritten() -> None:
    wanted, _ = wanted_rules([job("7", "n3", 0)], NODES, IDS, HOLDS)
    assert plan(wanted, {rule_name("gpu-1", 0): None}).update == (rule("gpu-1", 0, "7"),)


def test_the_rule_round_trips_and_names_the_job() -> None:
    body = rule_body(rule("gpu-1", 2, "42"))
    assert body["metadata"] == {"name": "nodeledger-gpu-1-g2", "labels": MANAGED_BY}
    assert body["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "gpu-1", "device": "gpu2"},
        "taint": {"key": TAINT_KEY, "value": "42", "effect": "NoSchedule"},
    }
    assert carried_of(body) == ("nodeledger-gpu-1-g2", Carried(IDS["gpu-1"][2], "42"))


@pytest.mark.parametrize(
    ("node", "index"),
    [("gpu-1", 0), ("GPU_01.Lab", 3), ("n" * 300, 7), ("n" * 300 + "x", 7)],
)
def test_rule_names_are_dns_subdomains(node: str, index: int) -> None:
    name = rule_name(node, index)
    assert len(name) <= 253
    assert name.startswith("nodeledger-")
    assert name.endswith(f"-g{index}")
    assert all(c.islower() or c.isdigit() or c in "-." for c in name)


def test_long_names_stay_apart() -> None:
    assert rule_name("n" * 300, 1) != rule_name("n" * 300 + "x", 1)


def test_identity_reads_the_index_attribute_of_the_newest_pool() -> None:
    def slice_(generation: int, *names: tuple[str, Any]) -> dict[str, Any]:
        devices = [{"name": n, "attributes": {"minor": v}} for n, v in names]
        pool = {"name": "gpu-1", "generation": generation}
        return {"spec": {"driver": DRIVER, "nodeName": "gpu-1", "pool": pool, "devices": devices}}

    slices = [
        slice_(1, ("old0", {"int": 0})),
        slice_(2, ("a", {"int": 0}), ("b", {"string": "1"}), ("c", {"int": 3})),
    ]
    assert identity(slices, "gpu-1", {DRIVER}, "minor") == {
        0: DeviceId(DRIVER, "gpu-1", "a"),
        3: DeviceId(DRIVER, "gpu-1", "c"),
    }


# ------------------------------------------------------------------ the reconciler


class FakeApi:
    """DeviceTaintRules by name, the node's slice, and the calls made."""

    def __init__(self, *, served: bool = True) -> None:
        self.served = served
        self.rules: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if method == "GET":
            if not self.served:
                raise KubeError("not found", 404)
            return {"resources": [{"name": "resourceslices"}, {"name": "devicetaintrules"}]}
        name = path.rsplit("/", 1)[1]
        if method == "POST":
            self.rules[body["metadata"]["name"]] = body
        elif method == "PATCH":
            self.rules[name]["spec"] = body["spec"]
        elif method == "DELETE":
            if name not in self.rules:
                raise KubeError("not found", 404)
            del self.rules[name]
        return {}

    def list(
        self, path: str, decode: Callable[[dict[str, Any]], Any], **query: Any
    ) -> tuple[list[Any], str]:
        assert path == RULES_PATH
        assert query["labelSelector"] == "app.kubernetes.io/managed-by=nodeledger"
        labelled = [r for r in self.rules.values() if r["metadata"].get("labels") == MANAGED_BY]
        return [decode(r) for r in labelled], "1"

    def resource_slices(self, node: str, drivers: Any) -> list[dict[str, Any]]:
        pool = {"name": node, "generation": 1}
        devices = [{"name": f"gpu{i}", "attributes": {"index": {"int": i}}} for i in range(4)]
        spec = {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices}
        return [{"spec": spec}]

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "GET"]


Listing = Mapping[str, Mapping[str, SlurmJob]]


def taints(
    api: FakeApi,
    listing: list[Listing | None],
    *,
    enabled: bool = True,
    holds: list[LedgerHolds] | None = None,
) -> DeviceTaints:
    """A reconciler reading ``listing[0]`` as the sync's jobs (swap it to change them) and
    ``holds[0]`` as the ledger's hold jobs (default HOLDS)."""
    recorded = holds or [HOLDS]
    return DeviceTaints(
        cast(KubeClient, api),
        lambda: NODES,
        lambda: listing[0],
        lambda: recorded[0],
        drivers={DRIVER},
        attribute="index",
        enabled=enabled,
        resync_period=300,
    )


def by_node(*jobs: SlurmJob) -> Listing:
    found: dict[str, dict[str, SlurmJob]] = {}
    for j in jobs:
        for a in j.allocations:
            found.setdefault(a.node, {})[j.job_id] = j
    return found


def values(api: FakeApi) -> dict[str, str]:
    return {n: r["spec"]["taint"]["value"] for n, r in api.rules.items()}


def test_the_reconciler_creates_updates_and_deletes() -> None:
    api = FakeApi()
    listing: list[Listing | None] = [by_node(job("7", "n3", 0, 1), hold("9", 2))]
    reconciler = taints(api, listing)
    reconciler.step()
    assert values(api) == {"nodeledger-gpu-1-g0": "7", "nodeledger-gpu-1-g1": "7"}
    rule0 = api.rules["nodeledger-gpu-1-g0"]["spec"]["deviceSelector"]
    assert rule0 == {"driver": DRIVER, "pool": "gpu-1", "device": "gpu0"}

    writes = len(api.writes())
    reconciler.step()  # the same listing: nothing to do, not even a list
    assert len(api.writes()) == writes

    listing[0] = by_node(job("8", "n3", 1))  # 7 ended; 8 got device 1
    reconciler.step()
    assert values(api) == {"nodeledger-gpu-1-g1": "8"}
    assert ("PATCH", f"{RULES_PATH}/nodeledger-gpu-1-g1") in api.calls
    assert reconciler.error is None


def test_a_hold_listed_before_its_admission_recorded_it_loses_its_taint_once_recorded() -> None:
    """Until the ledger records a hold job's id it is a Slurm job's (LedgerHolds); its
    recording changes no Slurm listing, yet takes the taint off the pod's device."""
    api = FakeApi()
    listing: list[Listing | None] = [by_node(hold("10", 2))]
    holds = [HOLDS]  # 10 not recorded yet
    reconciler = taints(api, listing, holds=holds)
    reconciler.step()
    assert values(api) == {"nodeledger-gpu-1-g2": "10"}
    holds[0] = LedgerHolds("slurm", HOLDS.recorded | {"10"})
    reconciler.step()  # the same listing
    assert api.rules == {}


def test_a_failed_slurm_read_deletes_nothing() -> None:
    api = FakeApi()
    listing: list[Listing | None] = [by_node(job("7", "n3", 0))]
    reconciler = taints(api, listing)
    reconciler.step()
    writes = len(api.writes())
    listing[0] = None  # the sync's last read failed
    reconciler.step()
    assert values(api) == {"nodeledger-gpu-1-g0": "7"}
    assert len(api.writes()) == writes
    listing[0] = by_node()  # read again: the job is gone
    reconciler.step()
    assert api.rules == {}


def test_turned_off_it_deletes_all_of_ours_once_and_nothing_else() -> None:
    api = FakeApi()
    foreign = {
        "metadata": {"name": "maintenance-gpu0", "labels": {"team": "ops"}},
        "spec": {"taint": {"key": "example.com/broken", "effect": "NoExecute"}},
    }
    api.rules["maintenance-gpu0"] = foreign
    listing: list[Listing | None] = [by_node(job("7", "n3", 0, 3))]
    taints(api, listing).step()
    assert set(api.rules) == {"maintenance-gpu0", "nodeledger-gpu-1-g0", "nodeledger-gpu-1-g3"}

    off = taints(api, listing, enabled=False)
    off.step()
    assert set(api.rules) == {"maintenance-gpu0"}
    calls = len(api.calls)
    off.step()  # once per term
    assert len(api.calls) == calls


def test_without_the_v1_api_it_falls_back_and_says_so() -> None:
    api = FakeApi(served=False)
    reconciler = taints(api, [by_node(job("7", "n3", 0))])
    reconciler.step()
    reconciler.step()
    assert api.writes() == []
    assert reconciler.note is not None
    assert "falling back to no taints" in reconciler.note
    assert [c for c in api.calls if c[0] == "GET"] == [("GET", "/apis/resource.k8s.io/v1")]


def test_a_failed_write_is_reported_and_retried() -> None:
    api = FakeApi()
    listing: list[Listing | None] = [by_node(job("7", "n3", 0))]
    reconciler = taints(api, listing)
    real = api.request

    def refuse(method: str, path: str, **kw: Any) -> dict[str, Any]:
        if method == "POST":
            raise KubeError("forbidden", 403)
        return real(method, path, **kw)

    api.request = refuse  # type: ignore[method-assign]
    reconciler.step()
    assert reconciler.error is not None
    assert "nodeledger-gpu-1-g0" in reconciler.error
    api.request = real  # type: ignore[method-assign]
    reconciler.step()
    assert values(api) == {"nodeledger-gpu-1-g0": "7"}
    assert reconciler.error is None


def test_without_gpu_drivers_it_reads_nothing() -> None:
    api = FakeApi()
    reconciler = DeviceTaints(
        cast(KubeClient, api),
        lambda: NODES,
        lambda: by_node(job("7", "n3", 0)),
        lambda: HOLDS,
        drivers=set(),
        attribute="index",
        enabled=True,
        resync_period=300,
    )
    reconciler.step()
    assert api.calls == []


def test_a_refused_list_is_reported_once_and_retried() -> None:
    api = FakeApi()
    reconciler = taints(api, [by_node(job("7", "n3", 0))])
    real = api.list

    def forbidden(*args: Any, **kw: Any) -> Any:
        raise KubeError("devicetaintrules is forbidden", 403)

    api.list = forbidden  # type: ignore[method-assign]
    reconciler.step()
    assert reconciler.error == "devicetaintrules is forbidden"
    api.list = real  # type: ignore[method-assign]
    reconciler.step()
    assert reconciler.error is None
    assert values(api) == {"nodeledger-gpu-1-g0": "7"}


def test_the_nodes_whose_taints_changed_are_told_and_shown() -> None:
    api = FakeApi()
    listing: list[Listing | None] = [by_node(job("7", "n3", 0), job("8", "n4", 2))]
    reconciler = taints(api, listing)
    told: list[set[str]] = []
    reconciler.changed = lambda nodes: told.append(set(nodes))
    reconciler.step()
    assert told == [{"gpu-1", "gpu-2"}]
    assert reconciler.tainted("gpu-1") == {0: ("7", "nodeledger-gpu-1-g0")}
    listing[0] = by_node(job("8", "n4", 2))
    reconciler.step()
    assert told[-1] == {"gpu-1"}
    assert reconciler.tainted("gpu-1") == {}


def test_status_gpus_lists_the_tainted_devices_beside_the_holdings() -> None:
    now = datetime(2026, 11, 27, tzinfo=UTC)
    pod = Holding(
        node="gpu-1",
        holder=Holder(HolderKind.POD, "uid-1", "default/trainer"),
        resources=Resources.ZERO,
        state=HoldingState.HELD,
        created_at=now,
        updated_at=now,
        devices=(HeldDevice(1, ""),),
    )
    tainted = {0: ("7", "nodeledger-gpu-1-g0"), 1: ("9", "nodeledger-gpu-1-g1")}
    assert gpus_of((pod,), tainted) == [
        {"device": 0, "holderKind": "slurm_job", "holderID": "7", "holder": "7",
         "deviceTaintRule": "nodeledger-gpu-1-g0"},
        {"device": 1, "holderKind": "pod", "holderID": "uid-1", "holder": "default/trainer"},
    ]  # fmt: skip


def test_a_new_leader_starts_from_the_rules_it_finds() -> None:
    """The old leader left rules of a job that ended while none led, and one now stale
    (another job has the device): the new one's first reconcile fixes both."""
    api = FakeApi()
    taints(api, [by_node(job("7", "n3", 0, 1))]).step()  # the old leader's term
    new = taints(api, [by_node(job("8", "n3", 1))])
    new.step()
    assert values(api) == {"nodeledger-gpu-1-g1": "8"}


def test_an_unknown_device_is_skipped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi()
    listing: list[Listing | None] = [by_node(job("7", "n3", 0, 9))]
    reconciler = taints(api, listing)
    with caplog.at_level("WARNING"):
        reconciler.step()
        listing[0] = by_node(job("7", "n3", 0, 9))  # a new listing, the same jobs
        reconciler.step()
    assert values(api) == {"nodeledger-gpu-1-g0": "7"}
    assert reconciler.skipped == ["job 7: device 9 of gpu-1 is in no ResourceSlice"]
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == [
        "GPU device taints: skipped job 7: device 9 of gpu-1 is in no ResourceSlice"
    ]
