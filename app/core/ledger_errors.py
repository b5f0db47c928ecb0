"""The ledger's refusals, as NodeledgerErrors (app.core.errors): their code, HTTP status
and whether retrying can help are data on the error, used alike by the API (mapped to HTTP
once, in app.api.errors) and by the reconcilers."""

from __future__ import annotations

from app.core.arithmetic import Shortfall
from app.core.errors import NodeledgerError


class LedgerError(NodeledgerError):
    """Base of every ledger error: the call makes no sense for the ledger as it is."""

    code = "ledger_error"
    http_status = 400


class NodeNotFound(LedgerError):
    code = "node_not_found"
    http_status = 404

    def __init__(self, node: str) -> None:
        super().__init__(f"node {node!r} is not in the ledger")
        self.node = node


class HoldingNotFound(LedgerError):
    code = "holding_not_found"
    http_status = 404

    def __init__(self, holder_id: str) -> None:
        super().__init__(f"no holding for holder {holder_id!r}")
        self.holder_id = holder_id


class AdmissionRejected(LedgerError):
    """The request does not fit now; it may fit after something is released."""

    code = "admission_rejected"
    http_status = 409
    retryable = True

    def __init__(self, message: str, shortfalls: tuple[Shortfall, ...] = ()) -> None:
        super().__init__(message)
        self.shortfalls = shortfalls


class HolderConflict(LedgerError):
    """The holder already holds something different (another node or other amounts)."""

    code = "holder_conflict"
    http_status = 409


class NodeInUse(LedgerError):
    """A node with holdings cannot be deleted."""

    code = "node_in_use"
    http_status = 409


class CapacityBelowHoldings(LedgerError):
    """A capacity change would leave holdings above capacity minus reserved."""

    code = "capacity_below_holdings"
    http_status = 409


class InvalidRequest(LedgerError):
    """Input that passed the schema but makes no sense for the ledger (releasing a slurm_job
    holding, which only the Slurm sync writes: the API's schema refuses it first)."""

    code = "invalid_request"
    http_status = 422
    field: str | None = None  # the input at fault, when one is (the API's 422 names it)


class SlurmNameTaken(InvalidRequest):
    """Another ledger node already maps to the Slurm node (its ``slurm_name``, or its name
    when it has none): two ledger nodes would push their counts over each other's on one
    Slurm node, each undoing the other's. Permanent until one of them is changed."""

    code = "slurm_name_taken"
    field = "slurm_name"

    def __init__(self, node: str, slurm_name: str, other: str) -> None:
        super().__init__(
            f"{self.field}: ledger node {other!r} already maps to Slurm node "
            f"{slurm_name!r}; give node {node!r} another slurm_name"
        )
        self.slurm_name = slurm_name
        self.other = other


class InvalidDevices(InvalidRequest):
    """GPU devices that a holding cannot name on its node: one twice, one the
    node does not have, or not one device per GPU asked for. Permanent: the same call
    fails again. ``field`` names the input at fault, as a 422 of the schema's would."""

    field = "devices"

    def __init__(self, reason: str) -> None:
        super().__init__(f"{self.field}: {reason}")
        self.reason = reason


class InvalidDeviceUuids(InvalidDevices):
    """GPU device UUIDs in the REST API's deprecated ``device_uuids``, beside
    devices given as indices, that cannot go with them: not one per device, one the ledger
    cannot keep, or a device with its UUID given in both places."""

    field = "device_uuids"


class DeviceTaken(AdmissionRejected):
    """A GPU device another holding on the node has: it may be free once that
    holding goes, so, like any admission that does not fit now, retryable. ``taken``: each
    device asked for that another holder has, with that holder's description."""

    code = "device_taken"

    def __init__(self, node: str, taken: tuple[tuple[int, str], ...]) -> None:
        held = "; ".join(f"GPU device {device} is held by {holder}" for device, holder in taken)
        super().__init__(f"node {node!r}: {held}")
        self.node = node
        self.taken = taken
