"""Where the slurmrestd JWT comes from: a file re-read whenever it changes (a Kubernetes
Secret is rotated by replacing the file), or a fixed value."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from app.slurm.errors import SlurmAuthError


class TokenSource(Protocol):
    def token(self) -> str: ...


class StaticToken:
    def __init__(self, value: str) -> None:
        self._value = value

    def token(self) -> str:
        return self._value


class FileToken:
    """Re-reads the file when its mtime, size or inode changes; one stat per call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._value = ""

    def token(self) -> str:
        try:
            st = self.path.stat()
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            with self._lock:
                if key != self._key:
                    self._value = self.path.read_text().strip()
                    self._key = key
                value = self._value
        except OSError as exc:
            raise SlurmAuthError(f"cannot read the Slurm token file {self.path}: {exc}") from exc
        if not value:
            raise SlurmAuthError(f"the Slurm token file {self.path} is empty")
        return value
