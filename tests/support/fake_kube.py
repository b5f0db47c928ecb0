"""Fake Kubernetes API clients for the controllers: a watch whose first stream ends in 410
Gone, a watch handler that records its resyncs and events, and a GenericNode status client
that keeps what it was sent."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class FakeWatchClient:
    """Lists return 'rv-N'; the first watch ends in 410 Gone, the second yields events."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0
        self.watched_from: list[str] = []

    def list(
        self, path: str, decode: Callable[[dict[str, Any]], Any], shape: Any = None, **query: Any
    ) -> tuple[list[Any], str]:
        self.lists += 1
        return [decode({"metadata": {"name": "x", "resourceVersion": "1"}})], f"rv-{self.lists}"

    def watch(self, path: str, version: str, timeout: int, **query: Any) -> Any:
        self.watches += 1
        self.watched_from.append(version)
        if self.watches == 1:
            yield {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}
        else:
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}}
            yield {"type": "ADDED", "object": {"metadata": {"name": "y", "resourceVersion": "6"}}}


class Recorder:
    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.resyncs: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    shape = None

    def decode(self, obj: dict[str, Any]) -> str:
        return str(obj["metadata"]["name"])

    def key(self, name: str) -> str:
        return name

    def resync(self, items: list[str]) -> None:
        self.resyncs.append(items)

    def on_event(self, kind: str, name: str) -> None:
        self.events.append((kind, name))
        self.stop.set()


class FakeStatusClient:
    """GenericNodes as Kubernetes keeps them: LIST returns their statuses, a status PATCH
    merges into one (and is counted)."""

    def __init__(self, *names: str) -> None:
        self.objects: dict[str, dict[str, Any]] = {n: {} for n in names}
        self.writes: list[dict[str, Any]] = []
        self.written: list[str] = []

    def list(
        self, path: str, decode: Callable[[dict[str, Any]], Any], shape: Any = None, **query: Any
    ) -> tuple[list[Any], str]:
        objects = [{"metadata": {"name": n}, "status": s} for n, s in self.objects.items()]
        return [decode(o) for o in objects], "1"

    def patch_status(self, path: str, status: dict[str, Any]) -> None:
        name = path.rsplit("/", 2)[-2] if path.endswith("/status") else path.rsplit("/", 1)[-1]
        self.objects.setdefault(name, {}).update(status)
        self.writes.append(status)
        self.written.append(name)
