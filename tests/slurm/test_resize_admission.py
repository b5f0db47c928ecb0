"""A pod's in-place growth is an admission, on the real clusters, with each of the service's
features that change what it asks Slurm (issue 48, item 2).

Pod accounting runs on the service's own admissions: a 4-CPU pod on n1 (16 CPUs), a Slurm
job on the CPUs left, then the pod resized to 8 CPUs while its kubelet still has 4 (it
defers the resize). The growth is refused, by the ledger or by Slurm's read-back of the
counts, whichever sees the job first; the holding stays at 4 and Slurm keeps withholding
only that (n1's k8scpu total, what Slurm's jobs may take, stays 12). Once the job ends, the
sweep admits the growth and Slurm withholds the 8.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.core.records import HolderKind
from app.kube.controllers.accounting import RESIZE_NOT_ADMITTED
from app.ledger.clock import utcnow
from app.ledger.service import Ledger
from tests.support.pod_accounting import reporting, running
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm

# Fits beside the pod's 4 CPUs and the headroom's 2 (FEATURES) on n1's 16, not beside 8.
JOB_CPUS = 10


def slurm_cpus(slurm: SlurmCluster) -> int:
    """The CPUs of n1 Slurm's jobs may take: its k8scpu total, which withholds the pods'."""
    return slurm.k8s_counts("n1")["k8scpu"]


def held(ledger: Ledger) -> int:
    """The pod's holding on n1, in millicores."""
    [holding] = ledger.holdings_of(HolderKind.POD, ["p"])
    return holding.resources.cpu_millis


def test_a_growth_beside_a_running_job_waits_until_the_job_ends(
    slurm: SlurmCluster, features_api: TestClient
) -> None:
    services = features_api.app.state.services  # type: ignore[attr-defined]
    reports: list[tuple[str, str, str]] = []
    accounting = reporting(services.admissions, utcnow, reports)
    accounting.on_event("ADDED", running("p", 4000, 4000))
    wait_until(lambda: slurm_cpus(slurm) <= 12, 30, what="the pod's 4 CPUs withheld from Slurm")
    job = slurm.sbatch("-w", "n1", "-c", str(JOB_CPUS), "--mem=1000", "--wrap", "sleep 600")
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 60, what=f"job {job} running")

    accounting.on_event("MODIFIED", running("p", 8000, 4000))
    assert held(services.ledger) == 4000
    [(_uid, reason, message)] = reports
    assert reason == RESIZE_NOT_ADMITTED, message
    assert slurm_cpus(slurm) >= JOB_CPUS  # what the job uses stays Slurm's
    accounting.sweep()  # the job still runs: the growth still waits
    assert held(services.ledger) == 4000
    assert slurm.job_state(job) == "RUNNING"

    slurm.run("scancel", job)

    def admitted() -> bool:
        accounting.sweep()
        return held(services.ledger) == 8000

    wait_until(admitted, 120, what="the growth admitted once the job ended")
    assert slurm_cpus(slurm) <= 8
