"""One replica runs the controllers: a coordination.k8s.io Lease, through the official
client's leader election. On shutdown the leader deletes the Lease so a restarted or
other replica takes over at once instead of waiting for it to expire."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kubernetes import client as k8s
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
from urllib3.exceptions import HTTPError

from app.kube.client import KubeClient, KubeError
from app.loops import Loop

log = logging.getLogger(__name__)


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float,
        on_start: Callable[[], None],
        on_stop: Callable[[], None],
    ) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.on_start = on_start
        self.on_stop = on_stop
        self.leading = threading.Event()
        # Never stopped: the official client's election cannot be interrupted (the thread
        # is a daemon); the service's stop releases the Lease instead (release()).
        self._loop = Loop(
            "leader-election", self._elect, interval=0, logger=log, what="leader election"
        )
        self._failed_at = float("-inf")  # the last failure of the election loop

    def start(self) -> None:
        self._loop.start()

    def _elect(self) -> float:
        """The loop's step: one election, until this replica stops leading or it fails;
        the seconds to pause before the next."""
        lock = LeaseLock(self.name, self.namespace, self.identity)
        lock.api_instance = k8s.CoordinationV1Api(self.client.api_client)
        config = electionconfig.Config(
            lock,
            lease_duration=int(self.lease_duration),
            renew_deadline=max(1, int(self.lease_duration * 2 / 3)),
            retry_period=max(1, int(self.lease_duration / 5)),
            onstarted_leading=self._started,
            onstopped_leading=self._stopped,
        )
        try:
            leaderelection.LeaderElection(config).run()
        except Exception as exc:  # the election loop must survive API hiccups
            # One line per outage, not one traceback per retry: a failure soon after the
            # last one is the same outage (the library retries every retry_period).
            now = time.monotonic()
            same = now - self._failed_at < 3 * config.retry_period
            self._failed_at = now
            if not isinstance(exc, OSError | HTTPError | KubeError):
                log.exception("leader election")  # not the API server away: a bug
            elif same:
                log.debug("leader election: %s", exc)
            else:
                log.warning("leader election: %s; retrying", exc)
            # A connection error escapes the client's loop, which pauses only after
            # API errors: without a pause here, an unreachable API server spun a core.
            return float(config.retry_period)
        return 0.0

    def _started(self) -> None:
        log.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)
        self.leading.set()
        self.on_start()

    def _stopped(self) -> None:
        log.warning("%s lost the lease %s/%s", self.identity, self.namespace, self.name)
        self.leading.clear()
        self.on_stop()

    def release(self) -> None:
        if not self.leading.is_set():
            return
        self.leading.clear()
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"
        try:
            self.client.request("DELETE", path)
        except KubeError as exc:
            log.warning("releasing the lease: %s", exc)
