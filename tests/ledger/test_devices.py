"""GPU devices held by identity (issue 23): the rules, pure (app.core.devices), and as the
ledger applies them on a real database: a device goes to one holding at a time, even to
admissions racing on several replicas; it is read back everywhere; its admission never
skips the gate through the headroom; the common admission, without devices, costs the
statements it did. Their UUIDs (informational) go with them, one object per device."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest
from sqlalchemy import event

from app.core.devices import MAX_DEVICES, device_refusal, from_parallel, held_devices
from app.core.headroom import HeadroomPolicy
from app.core.ledger_errors import (
    AdmissionRejected,
    DeviceTaken,
    HolderConflict,
    InvalidDevices,
    InvalidDeviceUuids,
    LedgerError,
)
from app.core.records import EventKind, HeldDevice, Holder, HolderKind, HoldingState, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot

GIB = 2**30
A = Holder(HolderKind.POD, "uid-a", "ns/a")
B = Holder(HolderKind.POD, "uid-b", "ns/b")
OPS = Holder(HolderKind.MANUAL, "ops-1")
GPU_NODE = NodeSpec(Resources(16000, 64 * GIB, 4))


def gpus(n: int) -> Resources:
    return Resources(1000, GIB, n)


# ---------------------------------------------------------------- the rules, pure


@dataclass(frozen=True)
class Case:
    devices: tuple[int, ...]
    gpus: int
    held: tuple[tuple[Holder, tuple[int, ...]], ...]
    refused: type[LedgerError] | None
    says: str = ""


CASES = {
    "free devices": Case((0, 2), 2, ((B, (1,)),), None),
    "one device of four": Case((3,), 1, (), None),
    "past the last GPU": Case((4,), 1, (), InvalidDevices, "no device 4 on the node"),
    "negative": Case((-1,), 1, (), InvalidDevices, "no device -1 on the node"),
    "fewer than the GPUs asked": Case((0,), 2, (), InvalidDevices, "1 device(s) named for"),
    "more than the GPUs asked": Case((0, 1), 1, (), InvalidDevices, "name one device per GPU"),
    "held by another pod": Case(
        (0, 1), 2, ((B, (1, 3)),), DeviceTaken, "GPU device 1 is held by pod ns/b (uid-b)"
    ),
    "held by a manual holder": Case(
        (2,), 1, ((OPS, (2,)),), DeviceTaken, "GPU device 2 is held by manual ops-1"
    ),
    "its own holding (a retry)": Case((0,), 1, ((A, (0,)),), None),
    "same id, other kind": Case(
        (0,), 1, ((Holder(HolderKind.MANUAL, "uid-a"), (0,)),), DeviceTaken, "device 0"
    ),
    "invalid before taken": Case((4,), 1, ((B, (4,)),), InvalidDevices),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_rules(case: Case) -> None:
    refused = device_refusal("n1", A, case.devices, case.gpus, 4, case.held)
    if case.refused is None:
        assert refused is None
        return
    assert type(refused) is case.refused
    assert refused is not None
    assert case.says in refused.message
    assert refused.message.startswith("devices: " if case.refused is InvalidDevices else "node")


def on(*indices: int) -> tuple[HeldDevice, ...]:
    return tuple(HeldDevice(i) for i in indices)


NAMED = {
    "named twice": (on(1, 1), "devices: each device may be named once; named more than once: 1"),
    "too many": (on(*range(MAX_DEVICES + 1)), "devices: at most 64 devices, got 65"),
    "a UUID too long": ((HeldDevice(0, "G" * 129),), "devices: the UUID of device 0: a UUID"),
    "a UUID not printable": (
        (HeldDevice(1), HeldDevice(0, "GPU-\x00")),
        "devices: the UUID of device 0",
    ),
}


@pytest.mark.parametrize(("devices", "says"), NAMED.values(), ids=NAMED.keys())
def test_the_rules_that_need_no_node(devices: tuple[HeldDevice, ...], says: str) -> None:
    with pytest.raises(InvalidDevices) as caught:
        held_devices(devices)
    assert caught.value.message.startswith(says)
    assert (caught.value.field, caught.value.http_status) == ("devices", 422)


def test_devices_are_held_by_index_with_their_uuids() -> None:
    named = (HeldDevice(3, "GPU-3"), HeldDevice(1), HeldDevice(0, "G" * 128))
    assert held_devices(named) == (named[2], named[1], named[0])
    assert held_devices(()) == ()


PARALLEL = {
    "UUIDs not one per device": ([0, 1], ["GPU-0"], "device_uuids: 1 UUID(s) for 2 device(s)"),
    "UUIDs without devices": ([], ["GPU-0"], "device_uuids: 1 UUID(s) for 0 device(s)"),
    "a UUID not printable": ([0, 1], ["", "\t"], "device_uuids: entry 1: a UUID is at most"),
}


@pytest.mark.parametrize(("indices", "uuids", "says"), PARALLEL.values(), ids=PARALLEL.keys())
def test_the_deprecated_two_arrays(indices: list[int], uuids: list[str], says: str) -> None:
    with pytest.raises(InvalidDeviceUuids) as caught:
        from_parallel(indices, uuids)
    assert caught.value.message.startswith(says)
    assert (caught.value.field, caught.value.http_status) == ("device_uuids", 422)


def test_the_deprecated_two_arrays_pair_by_place() -> None:
    assert from_parallel([2, 0], ["GPU-2", ""]) == (HeldDevice(2, "GPU-2"), HeldDevice(0))
    assert from_parallel([1], []) == on(1)


def test_the_errors_say_what_a_caller_needs() -> None:
    taken = device_refusal("n1", A, (0, 1), 2, 4, ((B, (0, 1)),))
    assert isinstance(taken, DeviceTaken)
    assert isinstance(taken, AdmissionRejected)  # what every admission path handles
    assert (taken.http_status, taken.code, taken.retryable) == (409, "device_taken", True)
    assert taken.taken == ((0, "pod ns/b (uid-b)"), (1, "pod ns/b (uid-b)"))
    invalid = device_refusal("n1", A, (9,), 1, 4, ())
    assert isinstance(invalid, InvalidDevices)
    assert (invalid.http_status, invalid.retryable, invalid.field) == (422, False, "devices")
    no_gpus = device_refusal("n1", A, (0,), 1, 0, ())
    assert no_gpus is not None
    assert "it has no GPUs" in no_gpus.message


# ---------------------------------------------------------------- the ledger


@pytest.fixture
def gpu_ledger(ledger: Ledger) -> Ledger:
    ledger.upsert_node("n1", GPU_NODE)
    return ledger


def test_a_device_goes_to_one_holding_and_is_read_back_everywhere(gpu_ledger: Ledger) -> None:
    ledger = gpu_ledger
    admission = ledger.admit(
        "n1", A, gpus(2), devices=(HeldDevice(3, "GPU-3"), HeldDevice(1, "GPU-1"))
    )
    assert admission.created
    assert admission.holding.devices == (HeldDevice(1, "GPU-1"), HeldDevice(3, "GPU-3"))
    with pytest.raises(DeviceTaken, match=r"GPU device 3 is held by pod ns/a \(uid-a\)"):
        ledger.admit("n1", B, gpus(1), devices=on(3))
    assert ledger.admit("n1", B, gpus(1), devices=on(0)).holding.devices == on(0)
    ledger.admit("n1", OPS, gpus(1))  # counted, as ever: takes no device
    with pytest.raises(AdmissionRejected):
        ledger.admit("n1", Holder(HolderKind.POD, "uid-c"), gpus(1), devices=on(2))  # 4 of 4
    expected = {A.id: admission.holding.devices, B.id: on(0), OPS.id: ()}
    reads = {
        "get_node": ledger.get_node("n1").holdings,
        "list_nodes": ledger.list_nodes()[0].holdings,
        "views_named": ledger.views_named(["n1"])[0].holdings,
        "list_holdings": tuple(ledger.list_holdings()),
        "holdings_page": ledger.holdings_page(10).items,
        "node_page": ledger.node_page(10).items[0].holdings,
        "snapshot": NodeSnapshot(ledger).views()["n1"].holdings,
    }
    for name, holdings in reads.items():
        assert {h.holder.id: h.devices for h in holdings} == expected, name
    rejected = ledger.events(node="n1", kind=EventKind.REJECTED)
    assert rejected[0].details == {"devices": [{"index": 3, "uuid": ""}], "taken": [3]}
    assert "GPU device 3 is held by pod ns/a" in rejected[0].message


def test_invalid_devices_write_nothing(gpu_ledger: Ledger) -> None:
    before = gpu_ledger.last_event_id()
    with pytest.raises(InvalidDevices, match="devices: no device 7 on the node"):
        gpu_ledger.admit("n1", A, gpus(1), devices=on(7))
    with pytest.raises(InvalidDevices, match="devices: 2 device"):
        gpu_ledger.admit("n1", A, gpus(1), devices=on(0, 1))
    with pytest.raises(InvalidDevices, match="devices: each device may be named once"):
        gpu_ledger.admit("n1", A, gpus(2), devices=on(1, 1))
    with pytest.raises(InvalidDevices, match="devices: the UUID of device 0"):
        gpu_ledger.admit("n1", A, gpus(1), devices=(HeldDevice(0, "\n"),))
    assert gpu_ledger.list_holdings() == []
    assert gpu_ledger.last_event_id() == before


def test_uuids_are_informational(gpu_ledger: Ledger) -> None:
    ledger = gpu_ledger
    # One not known is "", none known is (); a retry is the same admission whatever its
    # UUIDs say, answered with the holding's.
    some = ledger.admit("n1", A, gpus(2), devices=(HeldDevice(2, "GPU-2"), HeldDevice(0)))
    assert some.holding.devices == (HeldDevice(0), HeldDevice(2, "GPU-2"))
    retry = ledger.admit("n1", A, gpus(2), devices=(HeldDevice(0, "x"), HeldDevice(2, "y")))
    assert (retry.created, retry.holding.devices) == (False, some.holding.devices)
    none = ledger.admit("n1", B, gpus(1), devices=on(1))
    assert none.holding.devices == on(1)
    assert ledger.get_node("n1").holdings[1].devices == on(1)


def test_a_retry_gets_its_holding_and_other_devices_are_a_conflict(gpu_ledger: Ledger) -> None:
    ledger = gpu_ledger
    first = ledger.admit("n1", A, gpus(1), devices=on(2), state=HoldingState.PENDING)
    again = ledger.admit("n1", A, gpus(1), devices=on(2), state=HoldingState.PENDING)
    assert (first.created, again.created) == (True, False)
    assert again.holding == first.holding
    with pytest.raises(HolderConflict, match=r"GPU devices 2\)"):
        ledger.admit("n1", A, gpus(1), devices=on(1), state=HoldingState.PENDING)
    with pytest.raises(HolderConflict):
        ledger.admit("n1", A, gpus(1), state=HoldingState.PENDING)  # counted now
    # A retry on a full node is answered by its holding as well.
    ledger.admit("n1", B, Resources(15000, GIB, 3), devices=on(0, 1, 3))
    assert not ledger.admit("n1", A, gpus(1), devices=on(2), state=HoldingState.PENDING).created


def test_confirm_stores_the_hold_job_and_events_name_the_devices(gpu_ledger: Ledger) -> None:
    ledger = gpu_ledger
    ledger.admit(
        "n1",
        A,
        gpus(2),
        devices=(HeldDevice(0, "GPU-a"), HeldDevice(1, "GPU-b")),
        state=HoldingState.PENDING,
    )
    held = ledger.confirm(HolderKind.POD, A.id, slurm_hold="4242")
    devices = (HeldDevice(0, "GPU-a"), HeldDevice(1, "GPU-b"))
    assert (held.state, held.devices, held.slurm_hold) == (HoldingState.HELD, devices, "4242")
    # A second confirmation without a job keeps the one stored.
    assert ledger.confirm(HolderKind.POD, A.id).slurm_hold == "4242"
    assert ledger.get_node("n1").holdings[0].slurm_hold == "4242"
    assert NodeSnapshot(ledger).views()["n1"].holdings[0].slurm_hold == "4242"
    released = ledger.release(A.id, HolderKind.POD).holding
    assert (released.devices, released.slurm_hold) == (devices, "4242")
    by_kind = {e.kind: e for e in ledger.events(node="n1")}
    admitted = by_kind[EventKind.ADMITTED]
    assert admitted.message == "admitted ns/a on GPU devices 0, 1"
    objects = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]
    assert admitted.details == {"state": "pending", "devices": objects}
    confirmed = by_kind[EventKind.CONFIRMED]
    assert confirmed.message == "confirmed ns/a on GPU devices 0, 1, held by Slurm job 4242"
    details = {"devices": objects, "slurm_hold": "4242"}
    assert confirmed.details == details
    assert by_kind[EventKind.RELEASED].details == details
    # The device is free again.
    assert ledger.admit("n1", B, gpus(1), devices=on(1)).created


def test_counted_holdings_events_are_unchanged(gpu_ledger: Ledger) -> None:
    gpu_ledger.admit("n1", A, gpus(1), state=HoldingState.PENDING)
    held = gpu_ledger.confirm(HolderKind.POD, A.id)
    assert (held.devices, held.slurm_hold) == ((), None)
    gpu_ledger.release(A.id)
    for e in gpu_ledger.events(node="n1"):
        assert "devices" not in e.details
        assert "GPU device" not in e.message


def test_a_device_admission_never_skips_the_gate(database: Database) -> None:
    policy = HeadroomPolicy(amount=Resources(4000, 8 * GIB, 2), low_water=0.5, grow_step=1.0)
    ledger = Ledger(database, headroom=replace(policy, idle_seconds=300))
    ledger.upsert_node("n1", GPU_NODE)
    with ledger.exclusive("n1") as node:  # Slurm confirmed to withhold plenty
        node.finish(Resources(8000, 16 * GIB, 4), None)
    pending = HoldingState.PENDING
    assert ledger.admit("n1", A, gpus(1), state=pending, headroom=True).holding.state is (
        HoldingState.HELD
    )
    device = ledger.admit("n1", B, gpus(1), state=pending, headroom=True, devices=on(0))
    assert device.holding.state is pending
    assert not device.refill


@contextmanager
def statements(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_c: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def test_the_common_admission_costs_no_statement_more(database: Database) -> None:
    ledger = Ledger(database)
    ledger.upsert_node("n1", GPU_NODE)
    ledger.admit("n1", Holder(HolderKind.POD, "warm"), gpus(0))  # compiled, pool warm
    with statements(database) as counted:
        ledger.admit("n1", A, gpus(1))
    with statements(database) as named:
        ledger.admit("n1", B, gpus(1), devices=on(0))
    with statements(database) as with_uuids:
        uid_c = Holder(HolderKind.POD, "uid-c")
        ledger.admit("n1", uid_c, gpus(1), devices=(HeldDevice(1, "GPU-1"),))
    # lock, sums, insert, event: the devices are read only when named.
    assert len(counted) == 4, counted
    assert not any("devices" in s and "SELECT" in s for s in counted)
    assert len(named) == len(counted) + 1
    assert len(with_uuids) == len(named)  # the UUIDs go in the same insert


# ---------------------------------------------------------------- racing


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-replica", "two-replicas"])
def test_racing_admissions_of_one_device_admit_exactly_one(
    database_url: str, replicas: int
) -> None:
    """Four callers at once, each a pod asking for GPU device 1 of a node with 2 GPUs (room
    for two by count), round after round; on two replicas, two ledgers on their own
    connection pools. Exactly one gets it each round; the others are told who has it."""
    dbs = [Database.from_url(database_url, pool_size=8) for _ in range(replicas)]
    try:
        ledgers = [Ledger(db) for db in dbs]
        callers, rounds = 4, 15
        barrier = threading.Barrier(callers)

        def admit(node: str, i: int) -> str:
            holder = Holder(HolderKind.POD, f"{node}-{i}")
            barrier.wait()
            try:
                ledgers[i % replicas].admit(node, holder, gpus(1), devices=on(1))
            except DeviceTaken as exc:
                return "taken" if f"GPU device 1 is held by pod {node}-" in exc.message else "?"
            return "admitted"

        with ThreadPoolExecutor(max_workers=callers) as pool:
            for r in range(rounds):
                node = f"r{r}"
                ledgers[0].upsert_node(node, NodeSpec(Resources(16000, 64 * GIB, 2)))
                outcomes = list(pool.map(admit, [node] * callers, range(callers)))
                assert sorted(outcomes) == ["admitted"] + ["taken"] * (callers - 1), outcomes
                holdings = ledgers[-1].get_node(node).holdings
                assert [h.devices for h in holdings] == [on(1)]
    finally:
        for db in dbs:
            db.dispose()
