"""The GenericNode CRD, read as a file (the real API server takes it in test_status_writes):
the chart installs the same one, its schema keeps every field the status has, and
`kubectl get genericnode -o wide` adds the headroom's columns."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from app.core.components import Health
from app.core.genericnode import status_of
from app.core.records import NodeHeadroom, NodeSpec, NodeView
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
