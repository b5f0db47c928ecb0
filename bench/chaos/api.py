"""A client of the replicas that behaves like a scheduler facing replicas that die: a
request whose replica does not answer is sent again, same body, to the next replica,
until one answers or the retry window closes."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_WINDOW = 60.0  # seconds; several replica restarts on a loaded machine
# Never reached a replica, so nothing happened there: safe to send elsewhere.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Any
    attempts: int
    lost: bool  # an earlier attempt may have acted without answering (killed mid-request)


@dataclass
class Findings:
    """Things that should not happen, with when (seconds into the run) and the evidence.
    Shared by every thread."""

    started: float = field(default_factory=time.monotonic)
    items: list[dict[str, Any]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, **evidence: Any) -> None:
        with self._lock:
            self.kinds[kind] += 1
            if self.kinds[kind] <= 5:  # the first few of each kind carry the evidence
                at = round(time.monotonic() - self.started, 3)
                self.items.append({"kind": kind, "at_s": at, **evidence})

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass
class Traffic:
    """What the replicas answered, over all threads."""

    statuses: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self._lock:
            self.statuses[what] += 1


class Api:
    """One per thread (its own connection pool)."""

    def __init__(
        self,
        urls: list[str],
        findings: Findings,
        traffic: Traffic,
        rng: random.Random,
        *,
        timeout: float = 15.0,
    ) -> None:
        self.urls = urls
        self.findings = findings
        self.traffic = traffic
        self.rng = rng
        self.client = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.client.close()

    def _order(self, prefer: int | None) -> list[str]:
        urls = list(self.urls)
        self.rng.shuffle(urls)
        if prefer is not None:
            urls.remove(self.urls[prefer])
            urls.insert(0, self.urls[prefer])
        return urls

    def send(
        self, method: str, path: str, body: Any = None, *, prefer: int | None = None
    ) -> Answer | None:
        """The first answer that is not a 5xx; None when the retry window closed first.
        A 5xx other than 503 (database unavailable, retryable) is a finding."""
        order = self._order(prefer)
        deadline = time.monotonic() + RETRY_WINDOW
        attempts, lost = 0, False
        while True:
            url = order[attempts % len(order)]
            attempts += 1
            try:
                response = self.client.request(method, url + path, json=body)
            except httpx.TransportError as exc:
                self.traffic.count(f"transport:{type(exc).__name__}")
                lost = lost or not isinstance(exc, NOT_SENT)
            else:
                self.traffic.count(str(response.status_code))
                if response.status_code < 500:
                    return Answer(response.status_code, _json(response), attempts, lost)
                if response.status_code != 503:
                    self.findings.add(
                        "http_5xx",
                        request=f"{method} {path}",
                        replica=url,
                        status=response.status_code,
                        body=response.text[:300],
                    )
                lost = True  # a 5xx may come after part of the work was committed
            if time.monotonic() > deadline:
                return None
            if attempts % len(order) == 0:
                time.sleep(0.1)  # every replica failed in a row: one is restarting

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        """A read from whichever replica answers first; None if none does."""
        for url in self._order(None):
            try:
                response = self.client.get(url + path, params=params)
            except httpx.TransportError:
                continue
            if response.status_code == 200:
                return response.json()
        return None


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
