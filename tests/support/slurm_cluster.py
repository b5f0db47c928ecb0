"""The real Slurm test clusters (testenv/slurm/cluster.sh), one per Slurm release, as seen
by tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

from tests.support.realenv import REPO, run_script, wait_until

SCRIPT = Path(REPO) / "testenv" / "slurm" / "cluster.sh"
__all__ = ["SCRIPT", "SLURM_VERSIONS", "SlurmCluster", "cluster_sh", "wait_until"]

# The releases `make test` runs a cluster of; NODELEDGER_TEST_SLURM_VERSIONS narrows them for a
# quick local run. 25.11 is only built against (plugins and their C tests).
SLURM_VERSIONS = tuple(
    v for v in os.environ.get("NODELEDGER_TEST_SLURM_VERSIONS", "24.11,26.05").split(",") if v
)
# Offered by every supported release: 24.11 v0.0.40-42, 25.11 v0.0.41-44, 26.05 v0.0.42-45.
REST_API = "v0.0.42"


def cluster_sh(version: str, *args: str, timeout: float = 300, check: bool = True) -> str:
    env = {"NODELEDGER_SLURM_VERSION": version}
    return run_script(SCRIPT, *args, timeout=timeout, check=check, env=env)


@dataclass(frozen=True)
class SlurmCluster:
    version: str  # the release series: "24.11", "26.05"
    release: str  # the exact version the daemons report, e.g. "26.05.3"
    url: str
    token_file: Path
    user: str
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    # The job hint hook's configuration (slurm-plugins/hooks/nodeledger-job-hint), seen
    # from the host; absent: the hook does nothing.
    hint_config: Path | None = None

    @classmethod
    def from_env(cls, version: str) -> SlurmCluster:
        env = dict(re.findall(r"^export (\w+)=(.*)$", cluster_sh(version, "env"), re.MULTILINE))
        return cls(
            version,
            env["SLURM_VERSION"],
            env["SLURMRESTD_URL"],
            Path(env["SLURM_JWT_TOKEN_FILE"]),
            env["SLURM_USER"],
            hint_config=Path(env["SLURM_HINT_CONFIG"]) if "SLURM_HINT_CONFIG" in env else None,
        )

    def script(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        return cluster_sh(self.version, *args, timeout=timeout, check=check)

    def script_in_background(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["bash", str(SCRIPT), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "NODELEDGER_SLURM_VERSION": self.version},
        )

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def run(self, *args: str, check: bool = True) -> str:
        return self.script("exec", *args, check=check, timeout=60)

    def sbatch(self, *args: str) -> str:
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *args)
        return out.strip().split(";")[0]

    def scancel(self, *job_ids: str) -> None:
        if job_ids:
            self.run("scancel", *job_ids, check=False)

    def cancel_all(self) -> None:
        """Every job, whoever submitted it (REST submissions run as the token's user)."""
        jobs = self.run("squeue", "-h", "-o", "%i").split()
        if jobs:
            self.run("scancel", *jobs, check=False)
        wait_until(
            lambda: not self.run("squeue", "-h", "-o", "%i").strip(), 30, what="all jobs gone"
        )

    def node(self, name: str) -> dict[str, Any]:
        data = json.loads(self.run("scontrol", "--json", "show", "node", name))
        node: dict[str, Any] = data["nodes"][0]
        return node

    def k8s_counts(self, name: str) -> dict[str, int]:
        """The node's k8s GRES totals as Slurm shows them (scaled: 30K = 30720; absent = 0)."""
        counts = {"k8scpu": 0, "k8smemory": 0, "k8sgpu": 0}
        for entry in self.node(name)["gres"].split(","):
            key, _, count = entry.partition(":")
            if key in counts:
                number = count.split("(")[0]
                scale = 1024 ** (" KMGT".index(number[-1]) if number[-1] in "KMGT" else 0)
                counts[key] = int(number.rstrip("KMGT")) * scale
        return counts

    def job(self, job_id: str) -> dict[str, Any]:
        data = json.loads(self.run("scontrol", "--json", "show", "job", job_id))
        job: dict[str, Any] = data["jobs"][0]
        return job

    def job_state(self, job_id: str) -> str:
        state = self.job(job_id)["job_state"]
        return str(state[0] if isinstance(state, list) else state)

    def restart_ctld(self) -> None:
        self.script("restart-ctld", timeout=120)

    def reconfigure(self) -> None:
        self.script("reconfigure", timeout=60)

    def restart_slurmd(self, node: str) -> None:
        self.script("restart-slurmd", node, timeout=60)

    def stop_slurmd(self, node: str) -> None:
        self.script("stop-slurmd", node, timeout=60)

    def stop_restd(self) -> None:
        self.script("stop-restd", timeout=60)

    def start_restd(self) -> None:
        self.script("start-restd", timeout=60)

    def pause_restd(self) -> None:
        """slurmrestd stops answering but still accepts connections (SIGSTOP)."""
        self.script("pause-restd", timeout=60)

    def resume_restd(self) -> None:
        self.script("resume-restd", timeout=60)

    FULL_GRES: ClassVar[dict[str, str]] = {
        "n1": "k8scpu:16,k8smemory:32000",
        "n2": "k8scpu:16,k8smemory:32000",
        "n3": "k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:4",
    }

    def rest(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token}
        return httpx.request(
            method, f"{self.url}/slurm/{REST_API}/{path}", headers=headers, timeout=10, **kwargs
        )

    def set_gres(self, node: str, gres: str) -> None:
        self.rest("POST", f"node/{node}", json={"gres": gres}).raise_for_status()

    def reset(self) -> None:
        """No jobs, full counts, no nodeledger token in ``extra``, every node usable."""
        self.cancel_all()
        for node, gres in self.FULL_GRES.items():
            self.rest("POST", f"node/{node}", json={"gres": gres, "extra": ""}).raise_for_status()
            if {"DRAIN", "DOWN"} & set(self.node(node)["state"]):
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
