"""Hold jobs (issue 23) against scripted slurmrestd answers (httpx.MockTransport): what a
hold asks Slurm for, which refusals reject the admission, cancel and listing. The answers
are the ones the test clusters gave (docs/gpu-identity.md "Hold jobs, measured").

The tests marked slurm run on the real clusters, 24.11 and 26.05: a hold keeps Slurm's own jobs
off exactly the devices it names, a second hold of a held device is refused at once, a
cancel of the service's frees the device (marked released, it fences nothing), and the sync
does not take a hold for a Slurm job's holding."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.ledger_errors import AdmissionRejected
from app.core.slurm_models import RELEASED_COMMENT
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmRequestError, SlurmUnavailable
from app.slurm.holds import HoldJob, HoldJobs, hold_tres
from app.slurm.tokens import FileToken, StaticToken
from tests.slurm.helpers import admit, slurm_holdings
from tests.support.gpu import devices, gpu_job
from tests.support.slurm_cluster import SlurmCluster, wait_until

BUSY = {"error_number": 2016, "error": "Requested nodes are busy"}
PRIORITY = {"error_number": 2013, "error": "Immediate execution impossible, insufficient priority"}
NO_CONFIG = {"error_number": 2014, "error": "Requested node configuration is not available"}
NO_NODE = {"error_number": 2018, "error": "Invalid node name specified"}
DONE = {"error_number": 2021, "error": "Job/step already completing or completed"}
NO_JOB = {"error_number": 2017, "error": "Invalid job id specified"}


def fake_slurm(version: int, answers: dict[str, Any]) -> tuple[HoldJobs, list[httpx.Request]]:
    """HoldJobs on a slurmrestd offering API v0.0.<version>; ``answers``: "METHOD path"."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json={"paths": {f"/slurm/v0.0.{version}/jobs/": {}}})
        seen.append(request)
        answer = answers[f"{request.method} {request.url.path.split('/', 3)[-1]}"]
        response: httpx.Response = answer(request) if callable(answer) else answer
        return response

    client = SlurmClient(
        "http://slurm", StaticToken("t"), transport=httpx.MockTransport(handler), retries=2
    )
    return HoldJobs(client), seen


OK = httpx.Response(200, json={"errors": []})
ALLOCATED = {"POST job/allocate": httpx.Response(200, json={"job_id": 12}), "POST job/12": OK}


def hold(holds: HoldJobs) -> str:
    return holds.hold("n3", "pod-a", devices=[2, 1], cpus=1, memory_mb=100)


def test_devices_are_named_one_type_each() -> None:
    assert hold_tres([2, 1, 2]) == "gres/gpu:g1:1,gres/gpu:g2:1"


@pytest.mark.parametrize(("version", "flags"), [(42, None), (45, ["EXTERNAL_JOB"])])
def test_a_hold_asks_for_exactly_the_devices_now_at_top_priority(
    version: int, flags: list[str] | None
) -> None:
    holds, seen = fake_slurm(version, ALLOCATED)
    assert hold(holds) == "12"
    request, unlimited = seen
    assert request.url.path == f"/slurm/v0.0.{version}/job/allocate"
    job = json.loads(request.content)["job"]
    assert job["name"] == "nodeledger-hold"
    assert job["comment"] == "nodeledger-hold:pod-a"
    assert job["required_nodes"] == ["n3"]
    assert job["tres_per_node"] == "gres/gpu:g1:1,gres/gpu:g2:1"
    assert job["immediate"] is True
    assert job["minimum_cpus"] == 1
    assert job["memory_per_node"] == {"set": True, "number": 100}
    assert job["priority"] == {"set": True, "number": 4294967293}
    # No time limit asked: an unlimited one under a finite MaxTime leaves the job PENDING
    # while the allocation answers with its id (24.11); lifted by an operator's update.
    assert "time_limit" not in job
    assert job.get("flags") == flags  # EXTERNAL_JOB from v0.0.43 (Slurm 25.05) on
    assert unlimited.url.path == f"/slurm/v0.0.{version}/job/12"
    assert json.loads(unlimited.content) == {
        "time_limit": {"set": True, "infinite": True, "number": 0}
    }


def test_a_hold_whose_limit_cannot_be_lifted_is_ended() -> None:
    refused = httpx.Response(500, json={"errors": [{"error_number": 1, "error": "no"}]})
    answers = {**ALLOCATED, "POST job/12": refused, "DELETE job/12": OK, "POST node/n3": OK}
    holds, seen = fake_slurm(42, answers)
    with pytest.raises(SlurmRequestError):
        hold(holds)
    assert [f"{r.method} {r.url.path.rsplit('/', 2)[-2]}" for r in seen][-2:] == [
        "DELETE job",
        "POST node",
    ]


@pytest.mark.parametrize("error", [BUSY, PRIORITY, NO_CONFIG], ids=lambda e: e["error"])
@pytest.mark.parametrize("status", [422, 500])  # 26.05 answers 422, 24.11 500
def test_a_refusal_rejects_the_admission_naming_node_and_devices(
    error: dict[str, Any], status: int
) -> None:
    answer = httpx.Response(status, json={"errors": [error]})
    holds, seen = fake_slurm(45, {"POST job/allocate": answer})
    with pytest.raises(AdmissionRejected) as caught:
        hold(holds)
    assert "n3" in str(caught.value)
    assert "gpu1, gpu2" in str(caught.value)
    assert error["error"] in str(caught.value)
    assert len(seen) == 1


def test_other_refusals_are_slurm_errors() -> None:
    answer = httpx.Response(422, json={"errors": [NO_NODE]})
    holds, _ = fake_slurm(45, {"POST job/allocate": answer})
    with pytest.raises(SlurmRequestError, match="Invalid node name"):
        hold(holds)


def test_a_lost_answer_is_not_retried() -> None:
    # The allocation may have happened: a second one would hold the devices twice.
    def lost(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("lost", request=request)

    holds, seen = fake_slurm(45, {"POST job/allocate": lost})
    with pytest.raises(SlurmUnavailable):
        hold(holds)
    assert len(seen) == 1


def test_a_hold_names_a_device() -> None:
    holds, seen = fake_slurm(45, {})
    with pytest.raises(ValueError, match="device"):
        holds.hold("n3", "pod-a", devices=[], cpus=1, memory_mb=1)
    assert seen == []


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, json={"errors": []}),  # a job Slurm does not know, 24.11 and 26.05
        httpx.Response(200, json={"errors": [], "status": [{"error": {"code": 2021}}]}),  # ended
        httpx.Response(500, json={"errors": [DONE]}),
        httpx.Response(500, json={"errors": [NO_JOB]}),
    ],
    ids=["unknown", "ended", "done-error", "invalid-id"],
)
def test_cancel_is_idempotent_and_wakes_the_scheduler(answer: httpx.Response) -> None:
    holds, seen = fake_slurm(
        42,
        {
            "POST job/12": answer,
            "DELETE job/12": answer,
            "POST node/n3": httpx.Response(200, json={"errors": []}),
        },
    )
    holds.cancel("12", slurm_node="n3")
    assert [(r.method, r.url.path.rsplit("/", 2)[-2:]) for r in seen] == [
        ("POST", ["job", "12"]),
        ("DELETE", ["job", "12"]),
        ("POST", ["node", "n3"]),
    ]
    # Marked released first: the fence plugin then withholds none of the node's GPUs.
    assert json.loads(seen[0].content) == {"comment": RELEASED_COMMENT}
    assert json.loads(seen[2].content) == {}  # a no-op update


def test_cancel_of_a_job_slurm_forgot_does_nothing() -> None:
    holds, seen = fake_slurm(42, {"GET job/12": httpx.Response(500, json={"errors": [NO_JOB]})})
    holds.cancel("12")
    assert len(seen) == 1


def test_cancel_finds_the_node_when_not_told() -> None:
    job = {
        "job_id": 12, "name": "nodeledger-hold", "job_state": ["RUNNING"],
        "job_resources": {"nodes": {"allocation": [{"name": "n3", "cpus": {"count": 2}}]}},
    }  # fmt: skip
    ok = httpx.Response(200, json={"errors": []})
    holds, seen = fake_slurm(
        42,
        {
            "GET job/12": httpx.Response(200, json={"jobs": [job]}),
            "POST job/12": ok,
            "DELETE job/12": ok,
            "POST node/n3": ok,
        },
    )
    holds.cancel("12")
    assert [r.method for r in seen] == ["GET", "POST", "DELETE", "POST"]


def test_cancel_fails_on_other_errors() -> None:
    answer = httpx.Response(500, json={"errors": [{"error_number": 1, "error": "x"}]})
    # A mark refused does not keep the hold from being cancelled (that end fences the node).
    holds, seen = fake_slurm(42, {"POST job/12": answer, "DELETE job/12": answer})
    with pytest.raises(SlurmRequestError):
        holds.cancel("12", slurm_node="n3")
    assert [r.method for r in seen] == ["POST", "DELETE"]


def listed(job_id: int, name: str, comment: str, state: str, detail: str) -> dict[str, Any]:
    allocation = {"name": "n3", "cpus": {"count": 2}, "memory": {"allocated": 100}}
    return {
        "job_id": job_id, "name": name, "comment": comment, "user_name": "slurm",
        "job_state": [state], "gres_detail": [detail],
        "job_resources": {"nodes": {"allocation": [allocation]}},
    }  # fmt: skip


def test_running_lists_the_hold_jobs_holding_now() -> None:
    jobs = [
        listed(12, "nodeledger-hold", "nodeledger-hold:pod-a", "RUNNING",
               "gpu:g1:1(IDX:1),gpu:g2:1(IDX:2),k8scpu(CNT:2),k8smemory(CNT:100),k8sgpu(CNT:2)"),
        listed(13, "wrap", "", "RUNNING",
               "gpu:g0:1(IDX:0),gpu:g1:0(IDX:),gpu:g2:0(IDX:),gpu:g3:0(IDX:),k8sgpu(CNT:1)"),
        listed(14, "nodeledger-hold", "nodeledger-hold:pod-b", "CANCELLED", ""),
    ]  # fmt: skip
    holds, _ = fake_slurm(42, {"GET jobs/": httpx.Response(200, json={"jobs": jobs})})
    assert holds.running() == {"12": HoldJob("12", "pod-a", "n3", (1, 2))}


NODE = "n3"  # the ledger's gpu-1


@pytest.fixture
def holds(slurm: SlurmCluster) -> Iterator[HoldJobs]:
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
    yield HoldJobs(client)
    client.close()


@pytest.mark.slurm
def test_a_hold_keeps_jobs_off_its_device_until_cancelled(
    slurm: SlurmCluster, holds: HoldJobs
) -> None:
    # Device 0: the one a plain --gres=gpu:1 job would get first (lowest free).
    started = time.perf_counter()
    hold = holds.hold(NODE, "pod-a", devices=[0], cpus=1, memory_mb=100)
    held_ms = (time.perf_counter() - started) * 1000
    assert slurm.job_state(hold) == "RUNNING"
    assert devices(slurm, hold) == (0,)
    assert holds.running() == {hold: HoldJob(hold, "pod-a", NODE, (0,))}

    started = time.perf_counter()
    with pytest.raises(AdmissionRejected, match=r"n3 .*gpu0.*busy") as refused:
        holds.hold(NODE, "pod-b", devices=[0], cpus=1, memory_mb=100)
    refused_ms = (time.perf_counter() - started) * 1000

    plain = gpu_job(slurm, "gpu:1")
    wait_until(lambda: slurm.job_state(plain) == "RUNNING", 30, what="the plain GPU job running")
    assert devices(slurm, plain) == (1,)  # not the held device 0

    waiting = gpu_job(slurm, "gpu:g0:1")  # exactly the held device: waits for it
    time.sleep(1)
    assert slurm.job_state(waiting) == "PENDING"
    started = time.perf_counter()
    holds.cancel(hold, slurm_node=NODE)
    # Marked released before its cancel: its end withholds none of the node's GPUs
    # (prep/k8s_gpu_fence fences only a hold that ends under its pod).
    assert slurm.k8s_counts(NODE)["k8sgpu"] > 0
    wait_until(lambda: slurm.job_state(waiting) == "RUNNING", 60, interval=0.05, what="device 0")
    freed_s = time.perf_counter() - started
    assert devices(slurm, waiting) == (0,)
    wait_until(lambda: holds.running() == {}, 60, what="no hold jobs")
    holds.cancel(hold, slurm_node=NODE)  # again: a no-op
    print(
        f"Slurm {slurm.release} API {holds.client.version}: hold {held_ms:.1f} ms, refusal "
        f"{refused_ms:.1f} ms ({refused.value}), the waiting job ran {freed_s:.2f} s after "
        "the cancel"
    )


@pytest.mark.slurm
def test_a_hold_of_several_devices_takes_them_all_or_none(
    slurm: SlurmCluster, holds: HoldJobs
) -> None:
    first = holds.hold(NODE, "pod-a", devices=[1], cpus=1, memory_mb=100)
    with pytest.raises(AdmissionRejected):
        holds.hold(NODE, "pod-b", devices=[1, 2], cpus=1, memory_mb=100)
    second = holds.hold(NODE, "pod-b", devices=[2, 3], cpus=1, memory_mb=100)
    assert devices(slurm, second) == (2, 3)
    assert {h.holder_id: h.devices for h in holds.running().values()} == {
        "pod-a": (1,),
        "pod-b": (2, 3),
    }
    holds.cancel(first)  # the node read from Slurm
    holds.cancel(second)
    # 24.11: a cancelled allocation is COMPLETING (and still holds) until slurmd's epilog.
    wait_until(lambda: holds.running() == {}, 60, what="no hold jobs")


@pytest.mark.slurm
def test_the_sync_leaves_the_ledgers_hold_jobs_out_of_slurm_holdings(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    hold = admit(slurm_api, "gpu-1", "pod-a", "1", "1Gi", gpu=1, devices=[0]).json()["slurm_hold"]
    plain = gpu_job(slurm, "gpu:1")
    wait_until(lambda: slurm.job_state(plain) == "RUNNING", 30, what="the plain GPU job running")

    def settled() -> dict[str, dict[str, Any]]:
        held = slurm_holdings(slurm_api, "gpu-1")
        return held if plain in held and f"node:{NODE}" not in held else {}

    held = wait_until(settled, 60, what="the plain job held, nothing unlisted")
    assert hold not in held
    assert held[plain]["requests"]["gpu"] == 1
    time.sleep(1.5)  # a later pass does not change its mind
    assert set(slurm_holdings(slurm_api, "gpu-1")) == {plain}


@pytest.mark.slurm
def test_an_admission_is_not_refused_by_its_own_hold_job(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    """A pod given every GPU of gpu-1 leaves k8sgpu at 0, which Slurm hides from gres_used:
    the gate's push reads the jobs instead, among them the pod's hold job, which the ledger
    records only once the gate has confirmed. It is the pod's own, not a Slurm job's."""
    answer = admit(slurm_api, "gpu-1", "all-gpus", "1", "1Gi", gpu=4, devices=[0, 1, 2, 3])
    assert answer.status_code == 201, answer.text
    hold = answer.json()["slurm_hold"]
    assert slurm.job_state(hold) == "RUNNING"
    assert devices(slurm, hold) == (0, 1, 2, 3)
