"""The killer: SIGKILL of one replica at a time, at random moments (seeded), mostly the
Slurm-sync leader, otherwise a replica it has just sent an admission or a release to;
the victim is started again at once on the same port."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.chaos.api import Answer
from bench.chaos.observe import LeaderWatch
from bench.chaos.replicas import Replica, ReplicaPool
from bench.chaos.workload import PodClient


@dataclass
class KillStats:
    total: int = 0
    of_leader: int = 0  # aimed at the leader, or hit it by chance
    leader_not_found: int = 0  # a leader kill found no leader: a random replica instead
    during_admission: int = 0
    during_release: int = 0
    request_in_flight: int = 0  # the request sent just before the kill lost its answer
    kinds: Counter[str] = field(default_factory=Counter)


@dataclass
class InFlight:
    """A request the killer sent to its victim just before the kill."""

    client: PodClient
    answers: list[Answer | None] = field(default_factory=list)
    thread: threading.Thread | None = None


class Killer:
    """Kills one replica at a time at random moments and starts it again right away."""

    def __init__(
        self,
        pool: ReplicaPool,
        watch: LeaderWatch,
        client_factory: Callable[[int], PodClient],
        rng: random.Random,
        *,
        gap: tuple[float, float],
        leader_share: float,
    ) -> None:
        self.pool = pool
        self.watch = watch
        self.client_factory = client_factory
        self.rng = rng
        self.gap = gap
        self.leader_share = leader_share
        self.stats = KillStats()

    def run(self, kills: int, stop: threading.Event) -> None:
        """``kills`` kills, each a random gap after the previous victim answers again (with
        one replica, the service must serve between kills)."""
        for n in range(kills):
            if stop.wait(self.rng.uniform(*self.gap)):
                return
            in_flight = None
            if self.rng.random() < self.leader_share:
                victim = self.kill_leader()
            else:
                victim, in_flight = self.kill_during_request(release=self.rng.random() < 0.25)
            self.pool.restart(victim)
            if in_flight is not None:  # after the restart: alone, it waits for the victim
                self._collect(in_flight)
            print(f"kill {n + 1}/{kills}: replica {victim.index}", file=sys.stderr, flush=True)

    def kill_leader(self) -> Replica:
        victim = self.pool.leader()
        if victim is None:
            self.stats.leader_not_found += 1
            victim = self.rng.choice(self.pool.replicas)
            self._kill(victim, "random (no leader seen)")
            return victim
        self._kill(victim, "leader")
        return victim

    def kill_during_request(self, *, release: bool) -> tuple[Replica, InFlight]:
        """Send an admission (or a release) to a replica, kill it a few ms later: somewhere
        in hold -> push -> read back -> confirm, or before or after it. The request goes on
        (to another replica, or to the victim once it is back) in its own thread."""
        victim = self.rng.choice(self.pool.replicas)
        in_flight = InFlight(self.client_factory(1_000 + self.stats.total))
        call = in_flight.client.release if release else in_flight.client.admit
        in_flight.thread = threading.Thread(
            target=lambda: in_flight.answers.append(call(prefer=victim.index)), name="in-flight"
        )
        in_flight.thread.start()
        time.sleep(self.rng.uniform(0.0, 0.15))
        self._kill(victim, "during release" if release else "during admission")
        if release:
            self.stats.during_release += 1
        else:
            self.stats.during_admission += 1
        return victim, in_flight

    def _collect(self, in_flight: InFlight) -> None:
        if in_flight.thread is not None:
            in_flight.thread.join()
        in_flight.client.api.close()
        answer = in_flight.answers[0] if in_flight.answers else None
        if answer is not None and answer.lost:
            self.stats.request_in_flight += 1

    def _kill(self, victim: Replica, kind: str) -> None:
        """SIGKILL; a victim that was the leader (aimed at, or hit by chance) starts the
        clock for the takeover."""
        was_leader = kind == "leader" or self.watch.is_leader(victim)
        if was_leader and kind != "leader":
            kind += ", was the leader"
        if was_leader:
            self.watch.leader_killed(victim, time.monotonic())
            self.stats.of_leader += 1
        victim.kill()
        self.stats.total += 1
        self.stats.kinds[kind] += 1
