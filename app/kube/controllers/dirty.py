"""The nodes a reconciler must look at again, and the rate at which it writes them (the
status mirror, the placeholder pods, maintenance).

Names are added by the snapshot's refreshes, on whichever thread makes them, and taken by
the reconciler's own thread: the lock guards the set and is never held while the snapshot
is read (a refresh may call back into ``add``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from app.core.rate import TokenBucket


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


def write_at_rate(
    dirty: DirtyNames,
    bucket: TokenBucket,
    write: Callable[[str], bool],
    stop: threading.Event,
) -> None:
    """Write every marked name, one token per write that made an API call (``write``
    returns whether it did: a node already right costs none). A write that raises leaves
    its name marked, so the next pass tries it again, and the error goes to the caller."""
    while dirty and not stop.is_set():
        pause = bucket.wait_time()
        if pause:
            stop.wait(pause)
            continue
        while (name := dirty.pop()) is not None:
            try:
                if write(name):
                    break  # one token spent
            except BaseException:
                dirty.add([name])
                raise
