"""Request and response models of the REST API.

Quantities arrive as Kubernetes quantity strings or plain numbers and are converted to
integer base units here, at the edge: requests and reservations round up, capacities down.
Responses carry both the Kubernetes-style string and the integers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from app.api.devices import EXAMPLE_UUID, DeviceNamed, DeviceOut, from_request
from app.core.arithmetic import Shortfall
from app.core.devices import MAX_DEVICES
from app.core.headroom import free as headroom_free
from app.core.presentation import format_amount, format_cpu, format_memory
from app.core.quantities import (
    QUANTITY_PATTERN,
    Quantity,
    Rounding,
    cpu_millis,
    gpu_count,
)
from app.core.quantities import memory_bytes as to_memory_bytes
from app.core.records import (
    NO_HEADROOM,
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    LedgerEvent,
    NodeSpec,
    NodeView,
)
from app.core.resources import MAX_CPU_MILLIS, MAX_GPUS, MAX_MEMORY_BYTES, Resources

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
NO_NUL = r"^[^\x00]*$"  # PostgreSQL refuses NUL in text, even in a comparison
NodeName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=253, examples=["n1"])]
HOLDER_ID_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9_.:]*$"
HolderId = Annotated[str, Field(min_length=1, max_length=253, pattern=HOLDER_ID_PATTERN)]
# Free text that is stored: no NUL (a 422, not the database's 500).
LabelKey = Annotated[str, Field(max_length=317, pattern=NO_NUL)]
LabelValue = Annotated[str, Field(max_length=63, pattern=NO_NUL)]
Reason = Annotated[str, Field(min_length=1, max_length=1024, pattern=NO_NUL)]
PodRef = Annotated[str, Field(max_length=253, pattern=NO_NUL)]  # namespace, name


def _in_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC
        raise ValueError("the time is out of range once converted to UTC") from None


# A time with its zone, in UTC: a naive or unrepresentable one is a 422 naming the field.
UtcTime = Annotated[AwareDatetime, AfterValidator(_in_utc)]


def _quantity_schema(number: dict[str, Any], examples: list[Any]) -> WithJsonSchema:
    """A quantity string (Kubernetes grammar) or a plain number within the ledger's limits."""
    string = {"type": "string", "pattern": QUANTITY_PATTERN}
    return WithJsonSchema({"anyOf": [string, {"minimum": 0, **number}], "examples": examples})


_CPU = _quantity_schema({"type": "number", "maximum": MAX_CPU_MILLIS // 1000}, ["1500m", 2])
_MEMORY = _quantity_schema({"type": "number", "maximum": MAX_MEMORY_BYTES}, ["4Gi", "512Mi"])
_GPUS = _quantity_schema({"type": "integer", "maximum": MAX_GPUS}, [1, "2"])


def _converter(convert: Callable[[Quantity], int]) -> Any:
    def run(value: Any) -> int:
        if not isinstance(value, str | int | float):
            raise ValueError("must be a quantity string or a number")
        return convert(value)

    return BeforeValidator(run)


CpuUp = Annotated[int, _converter(lambda v: cpu_millis(v, Rounding.UP)), _CPU]
CpuDown = Annotated[int, _converter(lambda v: cpu_millis(v, Rounding.DOWN)), _CPU]
MemUp = Annotated[int, _converter(lambda v: to_memory_bytes(v, Rounding.UP)), _MEMORY]
MemDown = Annotated[int, _converter(lambda v: to_memory_bytes(v, Rounding.DOWN)), _MEMORY]
Gpus = Annotated[int, _converter(gpu_count), _GPUS]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A quantity's base-unit twin (cpu_millis, memory_bytes), as answers carry it beside it.
BaseUnits = Annotated[int, Strict(), Field(ge=0)]


class AmountsIn(StrictModel):
    """Amounts that may carry the twins an answer gives (Amounts), so that a node read can
    be written back: each accepted when it agrees with its quantity, else a 422 naming it."""

    @field_validator("cpu_millis", "memory_bytes", check_fields=False)
    @classmethod
    def _agrees(cls, twin: int | None, info: ValidationInfo) -> int | None:
        name = {"cpu_millis": "cpu", "memory_bytes": "memory"}[str(info.field_name)]
        amount = info.data.get(name)  # absent when the quantity itself was refused
        if twin is not None and amount is not None and twin != amount:
            raise ValueError(f"{twin} disagrees with {name}, {amount} in base units")
        return twin


class RequestsIn(StrictModel):
    """What a holder asks for; fractions round up (never hold less than asked)."""

    cpu: CpuUp = 0
    memory: MemUp = 0
    gpu: Gpus = 0

    def resources(self) -> Resources:
        return Resources(self.cpu, self.memory, self.gpu)

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if self.resources().is_zero():
            raise ValueError("requests: at least one of cpu, memory, gpu must be above zero")
        return self


class CapacityIn(AmountsIn):
    """A node's capacity; fractions round down (never promise more than exists)."""

    cpu: CpuDown
    memory: MemDown
    gpu: Gpus = 0
    cpu_millis: BaseUnits | None = None
    memory_bytes: BaseUnits | None = None

    @model_validator(mode="after")
    def _positive(self) -> Self:
        if self.cpu <= 0:
            raise ValueError("capacity.cpu must be above zero (at least 1m)")
        if self.memory <= 0:
            raise ValueError("capacity.memory must be above zero")
        return self


class ReservedIn(AmountsIn):
    """Kept back for the system and daemons; rounds up."""

    cpu: CpuUp = 0
    memory: MemUp = 0
    gpu: Gpus = 0
    cpu_millis: BaseUnits | None = None
    memory_bytes: BaseUnits | None = None


class NodeIn(StrictModel):
    capacity: CapacityIn
    reserved: ReservedIn = ReservedIn()
    slurm_name: NodeName | None = Field(default=None, description="Slurm's name when different")
    labels: dict[LabelKey, LabelValue] = {}
    cordon_reason: Reason | None = Field(
        default=None, description="Set to stop new admissions on this node; null clears it"
    )

    @model_validator(mode="before")
    @classmethod
    def _without_read_only(cls, body: Any) -> Any:
        # What a GET answers besides the spec (free, holdings...): the ledger computes it,
        # so a node read may be PUT back as it is, and that part of it is ignored.
        if isinstance(body, dict):
            return {k: v for k, v in body.items() if k not in _NODE_READ_ONLY}
        return body

    @model_validator(mode="after")
    def _reserved_within_capacity(self) -> Self:
        for name in ("cpu", "memory", "gpu"):
            if getattr(self.reserved, name) > getattr(self.capacity, name):
                raise ValueError(f"reserved.{name} exceeds capacity.{name}")
        return self

    def spec(self) -> NodeSpec:
        return NodeSpec(
            capacity=Resources(self.capacity.cpu, self.capacity.memory, self.capacity.gpu),
            reserved=Resources(self.reserved.cpu, self.reserved.memory, self.reserved.gpu),
            slurm_name=self.slurm_name,
            labels=dict(self.labels),
        )


def _has(field: str) -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"type": "string"}}}


class HolderIn(StrictModel):
    # What _identified checks, said in the OpenAPI document: a pod by its uid, a manual
    # holding by its id (or uid).
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"kind": {"const": "pod"}}},
            "then": _has("uid"),
            "else": {"anyOf": [_has("id"), _has("uid")]},
        },
    )

    kind: Literal["pod", "manual"] = Field(description="slurm_job holdings come from Slurm only")
    uid: HolderId | None = Field(default=None, description="Pod uid (kind pod)")
    id: HolderId | None = Field(default=None, description="Given id (kind manual)")
    namespace: PodRef | None = None
    name: PodRef | None = None

    @model_validator(mode="after")
    def _identified(self) -> Self:
        if self.kind == "pod" and not self.uid:
            raise ValueError("holder.uid is required for a pod")
        if self.kind == "manual" and not (self.id or self.uid):
            raise ValueError("holder.id is required for a manual holding")
        if self.uid and self.id and self.uid != self.id:
            raise ValueError("holder.uid and holder.id differ; give one")
        return self

    def holder(self) -> Holder:
        holder_id = self.uid or self.id
        assert holder_id is not None  # checked by _identified
        display = "/".join(p for p in (self.namespace, self.name) if p)
        return Holder(HolderKind(self.kind), holder_id, display)


class AdmissionIn(StrictModel):
    node: NodeName
    holder: HolderIn
    requests: RequestsIn
    devices: list[DeviceNamed] = Field(
        default=[],
        max_length=MAX_DEVICES,
        description=(
            "GPU devices on the node to hold by identity, one per GPU requested; another "
            "holding's device is a 409 `device_taken`. Empty: GPUs are counted only. "
            "Deprecated: indices alone (`[0, 1]`), with their UUIDs in `device_uuids`"
        ),
        examples=[[{"index": 0, "uuid": EXAMPLE_UUID}, {"index": 1}]],
    )
    device_uuids: list[Annotated[str, Strict()]] = Field(
        default=[],
        max_length=MAX_DEVICES,
        description=(
            "Deprecated, with `devices` as indices: their UUIDs, in the same order, one per "
            "device ('' for one not known). Give `devices` as objects instead"
        ),
        json_schema_extra={"deprecated": True},
    )

    def held_devices(self) -> tuple[HeldDevice, ...]:
        return from_request(self.devices, self.device_uuids)


class Amounts(BaseModel):
    cpu: str = Field(examples=["1500m"])
    memory: str = Field(examples=["2Gi"])
    gpu: int
    cpu_millis: int
    memory_bytes: int

    @classmethod
    def of(cls, r: Resources) -> Amounts:
        return cls(
            cpu=format_cpu(r.cpu_millis),
            memory=format_memory(r.memory_bytes),
            gpu=r.gpus,
            cpu_millis=r.cpu_millis,
            memory_bytes=r.memory_bytes,
        )


class HolderOut(BaseModel):
    kind: HolderKind
    id: str
    name: str


class HoldingOut(BaseModel):
    node: str
    holder: HolderOut
    requests: Amounts
    state: str
    created_at: datetime
    updated_at: datetime
    devices: list[DeviceOut] = Field(description="GPU devices held by identity; []: counted only")
    slurm_hold: str | None = Field(description="The Slurm job holding those devices, if any")

    @classmethod
    def of(cls, h: Holding) -> HoldingOut:
        return cls(
            node=h.node,
            holder=HolderOut(kind=h.holder.kind, id=h.holder.id, name=h.holder.display_name),
            requests=Amounts.of(h.resources),
            state=h.state.value,
            created_at=h.created_at,
            updated_at=h.updated_at,
            devices=[DeviceOut(index=d.index, uuid=d.uuid) for d in h.devices],
            slurm_hold=h.slurm_hold,
        )


class HeadroomOut(BaseModel):
    """The node's Kubernetes headroom: what Slurm is kept from ahead of demand, so that
    admissions inside it need no Slurm call (all zero when the headroom is off)."""

    target: Amounts = Field(
        description="What the ledger keeps withheld from Slurm beyond what is held (0: idle)"
    )
    granted: Amounts = Field(
        description="What Slurm was last confirmed to withhold for Kubernetes, holdings included"
    )
    free: Amounts = Field(
        description="granted minus what pods and manual reservations hold, at least 0: what "
        "admissions may still take without a Slurm call"
    )
    used_at: datetime | None = Field(description="The last admission that used it, if any")

    @classmethod
    def of(cls, v: NodeView) -> HeadroomOut:
        headroom = v.headroom
        if headroom is NO_HEADROOM:
            return HEADROOM_OFF  # built once: most nodes of a long listing, with it off
        return cls(
            target=Amounts.of(headroom.target),
            granted=Amounts.of(headroom.granted),
            free=Amounts.of(headroom_free(v).at_least_zero()),
            used_at=headroom.used_at,
        )


_ZERO = Amounts.of(Resources.ZERO)
HEADROOM_OFF = HeadroomOut(target=_ZERO, granted=_ZERO, free=_ZERO, used_at=None)


class NodeOut(BaseModel):
    name: str
    slurm_name: str | None
    labels: dict[str, str]
    capacity: Amounts
    reserved: Amounts
    held_by_kubernetes: Amounts
    held_by_slurm: Amounts
    held_manually: Amounts
    free: Amounts
    headroom: HeadroomOut
    admissible: bool
    reason: str | None
    cordon_reason: str | None
    health_reason: str | None
    holdings: list[HoldingOut]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, v: NodeView) -> NodeOut:
        return cls(
            name=v.name,
            slurm_name=v.spec.slurm_name,
            labels=v.spec.labels,
            capacity=Amounts.of(v.spec.capacity),
            reserved=Amounts.of(v.spec.reserved),
            held_by_kubernetes=Amounts.of(v.held_by_kubernetes),
            held_by_slurm=Amounts.of(v.held_by_slurm),
            held_manually=Amounts.of(v.held_manually),
            free=Amounts.of(v.free),
            headroom=HeadroomOut.of(v),
            admissible=v.admissible,
            reason=v.not_admissible_reason,
            cordon_reason=v.cordon_reason,
            health_reason=v.health_reason,
            holdings=[HoldingOut.of(h) for h in v.holdings],
            created_at=v.created_at,
            updated_at=v.updated_at,
        )


_NODE_READ_ONLY = frozenset(NodeOut.model_fields) - frozenset(NodeIn.model_fields)


class ShortfallOut(BaseModel):
    resource: str
    requested: str
    free: str
    requested_base: int
    free_base: int

    @classmethod
    def of(cls, s: Shortfall) -> ShortfallOut:
        return cls(
            resource=s.resource,
            requested=format_amount(s.resource, s.requested),
            free=format_amount(s.resource, s.free),
            requested_base=s.requested,
            free_base=s.free,
        )


class ErrorOut(BaseModel):
    detail: str
    code: str
    retryable: bool
    shortfalls: list[ShortfallOut] = []


class EventOut(BaseModel):
    id: int
    at: datetime
    kind: str
    node: str | None
    holder_kind: str | None
    holder_id: str | None
    amounts: Amounts | None
    message: str
    details: dict[str, Any]

    @classmethod
    def of(cls, e: LedgerEvent) -> EventOut:
        return cls(
            id=e.id,
            at=e.at,
            kind=e.kind.value,
            node=e.node,
            holder_kind=e.holder_kind.value if e.holder_kind else None,
            holder_id=e.holder_id,
            amounts=Amounts.of(e.resources) if e.resources else None,
            message=e.message,
            details=e.details,
        )


class HealthOut(BaseModel):
    status: Literal["ok", "degraded", "unavailable"]
    checks: dict[str, str] = {}
