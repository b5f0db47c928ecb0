"""GPU devices in the REST API: one object per device, ``{"index": 0, "uuid":
"GPU-..."}``, in requests and answers alike, as Kubernetes' own DRA allocation results are.

The earlier shape, ``devices`` as indices beside ``device_uuids`` in the same order, is
still accepted for one release (deprecated, docs/api.md#gpu-devices) and turned into the
objects here. The rules (each device named once, one UUID per device, which UUIDs the
ledger keeps) are app.core.devices', applied by the ledger to every caller's devices; their
errors name the field, which the API answers as a 422 (app.api.errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from app.core.devices import from_parallel
from app.core.ledger_errors import InvalidDeviceUuids
from app.core.records import HeldDevice
from app.core.resources import MAX_GPUS

EXAMPLE_UUID = "GPU-5ad9f3ab-1c4f-4e52-9b1e-0f3c1b2d4e6a"
# A GPU's index on its node: a JSON integer, not a quantity string.
DeviceIndex = Annotated[int, Strict(), Field(ge=0, lt=MAX_GPUS)]


class DeviceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: DeviceIndex = Field(description="The device's index on the node, 0..GPUs-1")
    uuid: Annotated[str, Strict()] = Field(
        default="",
        description="Its UUID, shown with the holding, never checked ('': not known); at "
        "most 128 printable ASCII characters",
        examples=[EXAMPLE_UUID],
    )


class DeviceOut(BaseModel):
    index: int
    uuid: str = Field(description="'' when not known")


def _object(value: Any) -> Any:
    # The deprecated shape's index alone stands for the object with it: a bad one is then
    # refused as the object's index would be (loc devices.N.index).
    return value if isinstance(value, dict | list | DeviceIn) else {"index": value}


# A device as an admission names it: the object, or (deprecated) its index alone.
DeviceNamed = Annotated[DeviceIn, BeforeValidator(_object)]


def from_request(
    devices: Sequence[DeviceIn], device_uuids: Sequence[str]
) -> tuple[HeldDevice, ...]:
    """The devices a request names. ``device_uuids`` (deprecated) gives their UUIDs by place,
    for devices named without one (app.core.devices.from_parallel); InvalidDeviceUuids (a
    422 naming it) when a device has its UUID in both."""
    if not device_uuids:
        return tuple(HeldDevice(d.index, d.uuid) for d in devices)
    if any(d.uuid for d in devices):
        raise InvalidDeviceUuids("give each UUID once: in devices (device_uuids is deprecated)")
    return from_parallel([d.index for d in devices], device_uuids)
