"""Property: whatever sequence of admissions, releases and capacity changes, no node's
holdings exceed capacity minus reserved (hypothesis state machine on a real SQLite ledger)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from app.core.ledger_errors import AdmissionRejected, CapacityBelowHoldings, HoldingNotFound
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger
from tests.support.databases import sqlite_database

NODES = ("a", "b")
amounts = st.builds(Resources, st.integers(0, 4000), st.integers(0, 4096), st.integers(0, 2))
capacities = st.builds(Resources, st.integers(1, 8000), st.integers(1, 8192), st.integers(0, 4))


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.db = Database.from_url(sqlite_database(Path(self.tmp.name)))
        self.ledger = Ledger(self.db)
        for name in NODES:
            self.ledger.upsert_node(name, NodeSpec(Resources(4000, 4096, 2)))
        self.uids: set[str] = set()
        self.counter = 0

    def teardown(self) -> None:
        self.db.dispose()
        self.tmp.cleanup()

    @rule(node=st.sampled_from(NODES), requests=amounts)
    def admit(self, node: str, requests: Resources) -> None:
        self.counter += 1
        uid = f"u{self.counter}"
        try:
            self.ledger.admit(node, Holder(HolderKind.POD, uid), requests)
            self.uids.add(uid)
        except AdmissionRejected:
            pass

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if not self.uids:
            return
        uid = data.draw(st.sampled_from(sorted(self.uids)))
        self.ledger.release(uid)
        self.uids.discard(uid)
        try:
            self.ledger.release(uid)
            raise AssertionError("second release must not find the holding")
        except HoldingNotFound:
            pass

    @rule(node=st.sampled_from(NODES), capacity=capacities, reserved=amounts)
    def change_capacity(self, node: str, capacity: Resources, reserved: Resources) -> None:
        reserved = Resources(
            min(reserved.cpu_millis, capacity.cpu_millis),
            min(reserved.memory_bytes, capacity.memory_bytes),
            min(reserved.gpus, capacity.gpus),
        )
        with contextlib.suppress(CapacityBelowHoldings):
            self.ledger.upsert_node(node, NodeSpec(capacity, reserved))

    @invariant()
    def holdings_within_capacity(self) -> None:
        for view in self.ledger.list_nodes():
            assert view.held.fits_within(view.allocatable), view
            assert view.admissible

    @invariant()
    def holdings_match_admitted(self) -> None:
        held = {h.holder.id for h in self.ledger.list_holdings()}
        assert held == self.uids


TestLedgerInvariant = LedgerMachine.TestCase
TestLedgerInvariant.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
