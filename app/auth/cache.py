"""A small TTL cache for review results: bounded, oldest out first, expired entries
dropped when met. Used from the event loop only, hence no lock."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    def __init__(
        self, ttl: float, maxsize: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.maxsize = maxsize
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if self._clock() >= expires:
            del self._entries[key]
            return None
        return value

    def put(self, key: K, value: V) -> None:
        if self.ttl <= 0:
            return
        self._entries.pop(key, None)
        while len(self._entries) >= self.maxsize:
            self._entries.popitem(last=False)
        self._entries[key] = (self._clock() + self.ttl, value)

    def __len__(self) -> int:
        return len(self._entries)
