"""Two ledger nodes never map to one Slurm node (issue 30): each would push its own counts
over the other's. Refused with a 422 naming ``slurm_name``, held by a unique index in the
database (migration 0005), which an existing ledger with such a pair cannot get silently."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from app.core.ledger_errors import SlurmNameTaken
from app.core.records import NodeSpec
from app.core.resources import Resources
from app.db import migrate
from app.db.engine import Database
from app.ledger.service import Ledger

SPEC = Resources(cpu_millis=8000, memory_bytes=16 * 2**30, gpus=0)
NODE = {"capacity": {"cpu": "8", "memory": "16Gi"}}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(("a", "n1"), ("b", "n1"), id="same-slurm-name"),
        pytest.param(("a", "n1"), ("n1", None), id="name-is-anothers-slurm-name"),
        pytest.param(("n1", None), ("a", "n1"), id="slurm-name-is-anothers-name"),
    ],
)
def test_a_second_node_on_one_slurm_node_is_refused(
    ledger: Ledger, first: tuple[str, str | None], second: tuple[str, str | None]
) -> None:
    ledger.upsert_node(first[0], NodeSpec(SPEC, slurm_name=first[1]))
    with pytest.raises(SlurmNameTaken, match="already maps to Slurm node 'n1'"):
        ledger.upsert_node(second[0], NodeSpec(SPEC, slurm_name=second[1]))
    assert [v.name for v in ledger.list_nodes()] == [first[0]]


def test_a_node_keeps_or_moves_its_own_mapping(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(SPEC, slurm_name="n1"))
    ledger.upsert_node("a", NodeSpec(SPEC, slurm_name="n1", labels={"x": "y"}))
    ledger.upsert_node("a", NodeSpec(SPEC, slurm_name="n2"))  # n1 is free again
    ledger.upsert_node("b", NodeSpec(SPEC, slurm_name="n1"))
    assert {v.name: v.slurm_name for v in ledger.list_nodes()} == {"a": "n2", "b": "n1"}


def test_the_api_answers_422_naming_slurm_name(api: TestClient) -> None:
    assert api.put("/v1/nodes/a", json={**NODE, "slurm_name": "n1"}).status_code == 201
    refused = api.put("/v1/nodes/b", json={**NODE, "slurm_name": "n1"})
    assert refused.status_code == 422
    body = refused.json()
    assert body["detail"][0]["loc"] == ["body", "slurm_name"], body
    assert "ledger node 'a' already maps to Slurm node 'n1'" in body["detail"][0]["msg"]
    assert api.get("/v1/nodes/b").status_code == 404


def _insert(db: Database, name: str, slurm_name: str | None) -> None:
    now = datetime.now(UTC)
    with db.write() as session:
        session.execute(
            text(
                "INSERT INTO nodes (name, slurm_name, cpu_millis, memory_bytes, gpus, "
                "reserved_cpu_millis, reserved_memory_bytes, reserved_gpus, labels, "
                "created_at, updated_at) VALUES (:name, :slurm_name, 1000, 1, 0, 0, 0, 0, "
                "'{}', :now, :now)"
            ),
            {"name": name, "slurm_name": slurm_name, "now": now},
        )


def test_the_database_refuses_a_pair_written_behind_the_ledger(database: Database) -> None:
    _insert(database, "a", "n1")
    with pytest.raises(IntegrityError):
        _insert(database, "n1", None)


def test_the_upgrade_keeps_rows_and_stops_on_an_existing_pair(database: Database) -> None:
    migrate.downgrade(database.engine, "0004")
    _insert(database, "a", "n1")
    _insert(database, "c", None)
    migrate.upgrade(database.engine)  # no pair: the index is made, the rows stay
    with database.read() as session:
        assert session.execute(text("SELECT count(*) FROM nodes")).scalar() == 2
    migrate.downgrade(database.engine, "0004")
    _insert(database, "n1", None)
    with pytest.raises(RuntimeError, match=r"n1: a, n1"):
        migrate.upgrade(database.engine)
    assert migrate.current(database.engine) == "0004"
    with database.read() as session:
        assert session.execute(text("SELECT count(*) FROM nodes")).scalar() == 3
