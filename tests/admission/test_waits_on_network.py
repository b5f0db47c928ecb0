"""The REST admission routes run admit/release inline on the event loop only when the call
cannot wait on another host: an SQLite ledger without a gate."""

from __future__ import annotations

import pytest

from app.admission.service import Admissions
from app.core.records import Holding
from app.db.engine import Database
from app.ledger.service import Ledger


class _Gate:
    def confirm(self, holding: Holding) -> None:
        """Agrees with everything."""

    def changed(self, node: str) -> None:
        """Nothing to tell."""

    def headroom_open(self, node: str) -> bool:
        return False

    def changed_later(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """No headroom."""


@pytest.mark.parametrize("gated", [False, True], ids=["no gate", "gate"])
def test_only_a_local_ungated_ledger_runs_inline(database: Database, gated: bool) -> None:
    admissions = Admissions(Ledger(database), _Gate() if gated else None)
    assert admissions.waits_on_network is (gated or not database.is_sqlite)
    assert admissions.holds_locally is database.is_sqlite
