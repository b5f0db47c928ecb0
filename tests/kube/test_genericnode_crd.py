"""The GenericNode CRD, read as a file (the real API server takes it in test_status_writes):
the chart installs the same one, its schema keeps every field the status has, and
`kubectl get genericnode -o wide` adds the headroom's columns."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from app.core.components import Health
from app.core.genericnode import fingerprint, status_of
from app.core.records import (
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    NodeHeadroom,
    NodeSpec,
    NodeView,
)
from app.core.resources import Resources
from tests.support.realenv import REPO

CRD = Path(REPO) / "crds" / "genericnodes.nodeledger.io.yaml"
CHART_CRD = Path(REPO) / "charts" / "nodeledger" / "crds" / "genericnodes.nodeledger.io.yaml"
GIB = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def version() -> dict[str, Any]:
    (served,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    return dict(served)


def test_the_chart_installs_the_same_crd() -> None:
    assert CHART_CRD.read_bytes() == CRD.read_bytes()


def test_the_wide_listing_adds_the_headroom_columns() -> None:
    columns = {c["name"]: c for c in version()["additionalPrinterColumns"]}
    headroom = {
        "Headroom CPU": ".status.headroom.target.cpu",
        "Headroom Free CPU": ".status.headroom.free.cpu",
        "Headroom Mem": ".status.headroom.target.memory",
        "Headroom Free Mem": ".status.headroom.free.memory",
    }
    for name, path in headroom.items():
        assert columns[name] == {"name": name, "type": "string", "priority": 1, "jsonPath": path}
    # Appended after the other wide columns: the default listing is unchanged.
    assert list(columns)[-4:] == list(headroom)


def test_the_schema_keeps_every_field_of_the_status() -> None:
    schema = version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    headroom = NodeHeadroom(Resources(2000, GIB), Resources(3000, 2 * GIB), T0)
    node = NodeView("a", NodeSpec(Resources(16000, 32 * GIB)), None, None, (), T0, T0, headroom)
    status = status_of(node, Health("ok"), {}, T0, "nvidia.com/gpu")
    assert set(status) <= set(schema)  # the API server would prune an unknown field
    assert set(status["headroom"]) == set(schema["headroom"]["properties"])
    for figures in status["headroom"].values():
        assert all(isinstance(v, str) for v in figures.values())  # additionalProperties: string


def test_the_status_says_which_holder_has_which_gpu_device() -> None:
    """Issue 23: one entry per device held by identity, by device, with its UUID when known,
    its holder and hold job; in the schema's terms, and a change of holder is a change the
    mirror writes."""
    spec = NodeSpec(Resources(16000, 32 * GIB, 4))
    pod = Holding(
        "a",
        Holder(HolderKind.POD, "uid-1", "ns/p"),
        Resources(1000, GIB, 2),
        HoldingState.HELD,
        T0,
        T0,
        devices=(HeldDevice(1, "GPU-1"), HeldDevice(3)),
        slurm_hold="77",
    )
    counted = Holding(
        "a", Holder(HolderKind.MANUAL, "ops"), Resources(0, 0, 1), HoldingState.HELD, T0, T0
    )
    node = NodeView("a", spec, None, None, (counted, pod), T0, T0)
    status = status_of(node, Health("ok"), {}, T0, "nvidia.com/gpu")
    entry = {"holderKind": "pod", "holderID": "uid-1", "holder": "ns/p", "slurmHold": "77"}
    assert status["gpus"] == [{"device": 1, "uuid": "GPU-1", **entry}, {"device": 3, **entry}]
    # No UUID known: no uuid field (optional in the schema).
    unknown = NodeView(
        "a", spec, None, None, (replace(pod, devices=(HeldDevice(1), HeldDevice(3))),), T0, T0
    )
    no_uuids = status_of(unknown, Health("ok"), {}, T0, "nvidia.com/gpu")["gpus"]
    assert no_uuids == [{"device": 1, **entry}, {"device": 3, **entry}]
    gpus = version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["gpus"]
    item = gpus["items"]
    for listed in status["gpus"]:
        assert set(listed) <= set(item["properties"])
        assert set(item["required"]) <= set(listed)
    assert item["properties"]["holderKind"]["enum"] == [k.value for k in HolderKind]
    assert item["properties"]["uuid"] == {
        "type": "string",
        "maxLength": 128,
        "description": "The GPU's UUID, when known (e.g. GPU-...).",
    }
    assert "uuid" not in item["required"]
    # Always written, empty too: a merge patch that left it out would keep the old list.
    empty = NodeView("a", spec, None, None, (counted,), T0, T0)
    assert status_of(empty, Health("ok"), {}, T0, "nvidia.com/gpu")["gpus"] == []
    assert fingerprint(status) != fingerprint(status_of(empty, Health("ok"), {}, T0, "gpu"))
    columns = {c["name"]: c["jsonPath"] for c in version()["additionalPrinterColumns"]}
    assert columns["GPU Devices Held"] == ".status.gpus[*].device"
