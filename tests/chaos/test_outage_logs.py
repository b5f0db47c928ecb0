"""PostgreSQL crashes (``pg_ctl stop -m immediate``) and comes back 2-3 s later, twice,
under load on two replicas: the logs an operator reads say so in a bounded number of
lines per outage (one when the database goes, one when it is back with the outage's
length), not one line or traceback per request; /readyz and the metrics show the outage
while it lasts. Real `nodeledger serve` processes and a real PostgreSQL."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.databases import PG_SCRIPT
from tests.support.service import ServiceProcess, running_service

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
OUTAGES = 2
# Per replica and outage: "unavailable" and "available again" for the database, and room
# for one line of each background component that noticed (a lost lease, say).
LINES_PER_OUTAGE = 6


def pg(command: str) -> None:
    subprocess.run(["bash", str(PG_SCRIPT), command], check=True, timeout=120)


@pytest.fixture
def replicas(postgres_url: str, tmp_path: Path) -> Iterator[list[ServiceProcess]]:
    env = {"NODELEDGER_LOG_LEVEL": "info"}
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                running_service(postgres_url, tmp_path, env=env, name=f"replica{i}")
            )
            for i in range(2)
        ]
    if subprocess.run(["bash", str(PG_SCRIPT), "status"], check=False).returncode != 0:
        pg("start")  # a failed test must not leave the database down for the next


def churn(url: str, worker: int, stop: threading.Event, answers: Counter[int]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        i = 0
        while not stop.is_set():
            uid = f"w{worker}-{i}"
            body = {
                "node": "n1",
                "holder": {"kind": "pod", "uid": uid},
                "requests": {"cpu": "500m", "memory": "1Gi"},
            }
            for answer in (
                client.post("/v1/admissions", json=body),
                client.delete(f"/v1/admissions/{uid}"),
                client.get("/v1/nodes/n1"),
            ):
                answers[answer.status_code] += 1
            i += 1


def test_an_outage_is_a_few_log_lines_not_one_per_request(
    replicas: list[ServiceProcess],
) -> None:
    first = httpx.Client(base_url=replicas[0].url, timeout=30)
    assert first.put("/v1/nodes/n1", json={"capacity": {"cpu": "64", "memory": "256Gi"}}).is_success
    started = [len(replica.log()) for replica in replicas]  # start-up lines do not count
    answers: Counter[int] = Counter()
    stop = threading.Event()
    seen_down: list[tuple[int, str, str]] = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        workers = [pool.submit(churn, replicas[w % 2].url, w, stop, answers) for w in range(4)]
        for _ in range(OUTAGES):
            time.sleep(1.5)
            pg("stop")
            time.sleep(1.0)
            ready = first.get("/readyz")
            metrics = first.get("/metrics").text
            up = re.search(r'nodeledger_dependency_up\{dependency="database"\} (\S+)', metrics)
            seen_down.append((ready.status_code, ready.text, up.group(1) if up else "absent"))
            time.sleep(1.5)
            pg("start")
        time.sleep(2.0)
        stop.set()
        for worker in workers:
            worker.result()
    assert answers[503] > 20, f"the outages were not seen: {answers}"
    assert set(answers) <= {200, 201, 404, 409, 503}, answers
    for status, body, up in seen_down:
        assert status == 503, body
        assert '"database":"unavailable for ' in body, body
        assert up == "0.0", up
    for replica, offset in zip(replicas, started, strict=True):
        log = replica.log()[offset:]
        noisy = log.splitlines()
        print(f"--- {replica.log_path.name}: {len(noisy)} lines", *noisy[:80], sep="\n")
        assert "Traceback" not in log
        assert "httpx" not in log
        assert len(noisy) <= OUTAGES * LINES_PER_OUTAGE, len(noisy)
        back = re.findall(r"database available again after ([0-9.]+) s", log)
        assert len(back) == OUTAGES, back
        assert all(1.0 < float(seconds) < 30 for seconds in back), back
        assert len(re.findall(r"database unavailable", log)) == OUTAGES
