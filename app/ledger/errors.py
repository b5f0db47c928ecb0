"""Domain errors. Whether retrying can help is data on the error, used alike by the API
(mapped to HTTP once, in app.api.errors) and by the reconcilers."""

from __future__ import annotations

from app.ledger.arithmetic import Shortfall


class LedgerError(Exception):
    """Base of every ledger error; ``retryable`` says whether the same call may succeed later."""

    retryable = False
    code = "ledger_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NodeNotFound(LedgerError):
    code = "node_not_found"

    def __init__(self, node: str) -> None:
        super().__init__(f"node {node!r} is not in the ledger")
        self.node = node


class HoldingNotFound(LedgerError):
    code = "holding_not_found"

    def __init__(self, holder_id: str) -> None:
        super().__init__(f"no holding for holder {holder_id!r}")
        self.holder_id = holder_id


class AdmissionRejected(LedgerError):
    """The request does not fit now; it may fit after something is released."""

    retryable = True
    code = "admission_rejected"

    def __init__(self, message: str, shortfalls: tuple[Shortfall, ...] = ()) -> None:
        super().__init__(message)
        self.shortfalls = shortfalls


class HolderConflict(LedgerError):
    """The holder already holds something different (another node or other amounts)."""

    code = "holder_conflict"


class NodeInUse(LedgerError):
    """A node with holdings cannot be deleted."""

    code = "node_in_use"


class CapacityBelowHoldings(LedgerError):
    """A capacity change would leave holdings above capacity minus reserved."""

    code = "capacity_below_holdings"


class InvalidRequest(LedgerError):
    """Input that passed the schema but makes no sense for the ledger."""

    code = "invalid_request"
