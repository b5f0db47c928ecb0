"""Background parts of the service (Slurm sync, Kubernetes controllers) as seen by the
application: start, stop, and say how healthy they are for /readyz."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class Health:
    status: Literal["ok", "degraded"]
    message: str = "ok"


class Component(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def health(self) -> Health: ...
