"""The nodes a reconciler must look at again (the status mirror, maintenance).

Added to by the snapshot's refreshes, on whichever thread makes them, and taken by the
reconciler's own thread: the lock guards the set and is never held while the snapshot is
read (a refresh may call back into ``add``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection


class DirtyNames:
    def __init__(self) -> None:
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._names)

    def add(self, names: Collection[str]) -> None:
        with self._lock:
            self._names.update(names)

    def pop(self) -> str | None:
        """One name, or None when there is none."""
        with self._lock:
            return self._names.pop() if self._names else None

    def take(self) -> set[str]:
        """Every name, leaving none."""
        with self._lock:
            names, self._names = self._names, set()
        return names
