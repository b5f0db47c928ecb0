"""A watch of the default namespace's pods on the real control plane, and what it saw."""

from __future__ import annotations

import threading
from typing import Any

from app.core.pods import PodShape

PODS = "/api/v1/namespaces/default/pods"


class Seen:
    """A watch handler that records what it was given."""

    shape = PodShape

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.changed = threading.Event()

    def decode(self, obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["name"])

    def key(self, item: str) -> str:
        return item

    def resync(self, items: list[str]) -> None:
        self.listed = items

    def on_event(self, kind: str, item: str) -> None:
        self.events.append((kind, item))
