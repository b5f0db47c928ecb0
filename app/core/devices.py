"""GPU devices held by identity: which device indices a holding may name on a
node, and which of them another holding has already. Pure.

Counted GPUs cannot tell which physical device a pod and a Slurm job run on
(docs/gpu-identity.md); a holding that names its devices can. The rules, in the order
checked (the first that fails is the answer):

1. the devices are valid for the request: each named once with a UUID the ledger can keep
   ("" when not known), each on the node (indices 0..GPUs-1 of its capacity), one device
   per GPU asked for; else InvalidDevices (422). The part that needs no node
   (held_devices) is the one place these rules are written: the REST API answers its
   errors as 422s naming the field;
2. no other holding on the node has any of them; else DeviceTaken (409, naming each
   device and its holder). The holder's own holding is not "another": a retry of the
   same admission is answered by the ledger with the holding it has.

The ledger applies them (app.ledger.commands.admit) under the node's row lock, in the
transaction that writes the holding, so that of two admissions of one device, in one
process or on several replicas, exactly one gets it. Here they are plain functions over
plain data, so that a table can test them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from app.core.ledger_errors import DeviceTaken, InvalidDevices, InvalidDeviceUuids, LedgerError
from app.core.records import HeldDevice, Holder

MAX_DEVICES = 64  # devices one holding may name: more GPUs than a node has
MAX_UUID_LENGTH = 128  # a device UUID's characters (NVIDIA's: 40, "GPU-" and a UUID)
_UUID_RULE = f"a UUID is at most {MAX_UUID_LENGTH} printable ASCII characters"


def valid_uuid(value: object) -> bool:
    """Whether ``value`` may be a device's UUID as the ledger keeps it: a string of at most
    MAX_UUID_LENGTH printable ASCII characters (empty: not known)."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_UUID_LENGTH
        and all(" " <= c <= "~" for c in value)
    )


def held_devices(devices: Iterable[HeldDevice]) -> tuple[HeldDevice, ...]:
    """``devices`` by index, once the part of rule 1 that needs no node holds: each device
    named once, at most MAX_DEVICES, each UUID one the ledger can keep (valid_uuid); else
    InvalidDevices."""
    ordered = tuple(sorted(devices, key=lambda d: d.index))
    twice = sorted(d for d, n in Counter(d.index for d in ordered).items() if n > 1)
    if twice:
        raise InvalidDevices(f"each device may be named once; named more than once: {_list(twice)}")
    if len(ordered) > MAX_DEVICES:
        raise InvalidDevices(f"at most {MAX_DEVICES} devices, got {len(ordered)}")
    unfit = [d.index for d in ordered if not valid_uuid(d.uuid)]
    if unfit:
        raise InvalidDevices(f"the UUID of device {_list(unfit)}: {_UUID_RULE}")
    return ordered


def from_parallel(indices: Sequence[int], uuids: Sequence[str]) -> tuple[HeldDevice, ...]:
    """The devices of the deprecated two-array shape (``devices`` as indices beside
    ``device_uuids``, one per device in the same order; [] when none is known), for
    held_devices to judge; InvalidDeviceUuids when the UUIDs are not one per device or one
    cannot be kept."""
    if uuids and len(uuids) != len(indices):
        raise InvalidDeviceUuids(
            f"{len(uuids)} UUID(s) for {len(indices)} device(s); give one per device"
        )
    unfit = [n for n, uuid in enumerate(uuids) if not valid_uuid(uuid)]
    if unfit:
        raise InvalidDeviceUuids(f"entry {_list(unfit)}: {_UUID_RULE}")
    return tuple(
        HeldDevice(i, u) for i, u in zip(indices, uuids or [""] * len(indices), strict=True)
    )


def describe_holder(holder: Holder) -> str:
    """A holder as an error message names it: kind, name and id."""
    if holder.display_name and holder.display_name != holder.id:
        return f"{holder.kind.value} {holder.display_name} ({holder.id})"
    return f"{holder.kind.value} {holder.id}"


def invalid_devices(devices: Sequence[int], gpus: int, node_gpus: int) -> str | None:
    """Why ``devices`` (indices, each once: held_devices) cannot be the GPUs of a request
    for ``gpus`` on a node with ``node_gpus`` (rule 1), or None."""
    outside = sorted(d for d in devices if not 0 <= d < node_gpus)
    if outside:
        where = f"GPUs 0..{node_gpus - 1}" if node_gpus > 0 else "no GPUs"
        return f"no device {_list(outside)} on the node (it has {where})"
    if len(devices) != gpus:
        return (
            f"{len(devices)} device(s) named for a request of {gpus} GPU(s); "
            "name one device per GPU asked for"
        )
    return None


def taken(
    devices: Sequence[int], held: Iterable[tuple[Holder, Sequence[int]]], holder: Holder
) -> tuple[tuple[int, Holder], ...]:
    """Each of ``devices`` that a holder other than ``holder`` has among ``held`` (the
    node's holdings: holder and devices), with that holder, by device (rule 2)."""
    wanted = set(devices)
    found = {
        device: other
        for other, others in held
        if other.kind is not holder.kind or other.id != holder.id
        for device in others
        if device in wanted
    }
    return tuple(sorted(found.items()))


def device_refusal(
    node: str,
    holder: Holder,
    devices: Sequence[int],
    gpus: int,
    node_gpus: int,
    held: Iterable[tuple[Holder, Sequence[int]]],
) -> LedgerError | None:
    """The error that refuses ``holder`` these ``devices`` for ``gpus`` GPUs on ``node``
    (rules 1 and 2, in order), or None when it may have them."""
    if (reason := invalid_devices(devices, gpus, node_gpus)) is not None:
        return InvalidDevices(reason)
    if conflicts := taken(devices, held, holder):
        return DeviceTaken(node, tuple((d, describe_holder(h)) for d, h in conflicts))
    return None


def _list(devices: Sequence[int]) -> str:
    return ", ".join(str(d) for d in devices)
