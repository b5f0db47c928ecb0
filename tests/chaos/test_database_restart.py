"""PostgreSQL restarts under load: requests fail cleanly (503 naming the database, or the
ledger's own 409) and the service recovers without being restarted; nothing the ledger
holds exceeds the node. A real `nodeledger serve` and a real PostgreSQL restart."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.databases import PG_SCRIPT
from tests.support.service import running_service

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
CLEAN = {200, 201, 404, 409, 503}


def test_requests_fail_cleanly_and_recover_after_a_database_restart(
    postgres_url: str, tmp_path: Path
) -> None:
    with running_service(postgres_url, tmp_path) as service:
        api = httpx.Client(base_url=service.url, timeout=30)
        node = {"capacity": {"cpu": "16", "memory": "64Gi"}}
        assert api.put("/v1/nodes/n1", json=node).status_code == 201
        answers: Counter[int] = Counter()
        bodies: list[str] = []
        stop = threading.Event()

        def churn(worker: int) -> None:
            with httpx.Client(base_url=service.url, timeout=30) as client:
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
                    ):
                        answers[answer.status_code] += 1
                        if answer.status_code >= 500:
                            bodies.append(answer.text)
                    i += 1

        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(churn, w) for w in range(4)]
            time.sleep(1.0)
            subprocess.run(["bash", str(PG_SCRIPT), "restart"], check=True, timeout=120)
            time.sleep(1.0)
            stop.set()
            for future in futures:
                future.result()

        assert set(answers) <= CLEAN, (answers, bodies[:3])
        assert answers[503] > 0, f"the restart was not seen: {answers}"
        assert all("database unavailable" in b for b in bodies), bodies[:3]
        # Recovered by itself: admissions work again through the same process.
        deadline = time.monotonic() + 15
        while (code := api.post("/v1/admissions", json={
            "node": "n1", "holder": {"kind": "pod", "uid": "after"},
            "requests": {"cpu": "1", "memory": "1Gi"},
        }).status_code) != 201:  # fmt: skip
            assert time.monotonic() < deadline, f"still {code} after the restart"
            time.sleep(0.2)
        view = api.get("/v1/nodes/n1").json()
        assert view["free"]["cpu_millis"] >= 0
        assert view["free"]["memory_bytes"] >= 0
        assert service.process.poll() is None
        print(f"answers during a PostgreSQL restart: {dict(answers)}")
