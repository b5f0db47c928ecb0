"""The real Slurm test clusters (testenv/slurm/cluster.sh), one per Slurm release, as seen
by tests."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from tests.support import workers
from tests.support.realenv import REPO, run_command, run_script, wait_until
from tests.support.workers import main_cache

SCRIPT = Path(REPO) / "testenv" / "slurm" / "cluster.sh"
__all__ = [
    "N3_GPUS",
    "SCRIPT",
    "SLURM_VERSIONS",
    "SlurmCluster",
    "cluster_sh",
    "k8s_counts",
    "main_cache",
    "scale_env",
    "seed_cache",
    "wait_until",
]

# The releases `make test` runs a cluster of; NODELEDGER_TEST_SLURM_VERSIONS narrows them for a
# quick local run. 25.11 is only built against (plugins and their C tests).
SLURM_VERSIONS = tuple(
    v for v in os.environ.get("NODELEDGER_TEST_SLURM_VERSIONS", "24.11,26.05").split(",") if v
)
# Offered by every supported release: 24.11 v0.0.40-42, 25.11 v0.0.41-44, 26.05 v0.0.42-45.
REST_API = "v0.0.42"
# What cluster.sh's in_cluster gives a command inside the chroot (env -i).
IN_CLUSTER_ENV = (
    "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "SLURM_CONF=/etc/slurm/slurm.conf",
)
MUNGED = "/usr/sbin/munged"  # started first, stopped last: the cluster's mount namespace
_ANCHORS: dict[Path, int] = {}  # chroot -> its munged's pid
# n3's four GPUs, one GRES type per device (gN is /dev/nvidiaN; cluster.sh, issue 23).
N3_GPUS = "gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1"


def cluster_sh(
    version: str,
    *args: str,
    timeout: float = 300,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> str:
    """``env``: more for the script (a cluster of its own: scale_env). Without a cache of
    its own, the script runs on this worker's copy of the release's chroot (seed_cache)."""
    if "NODELEDGER_CACHE" not in (env or {}):
        seeded(version, workers.cache())
    env = {**(env or {}), "NODELEDGER_SLURM_VERSION": version}
    return run_script(SCRIPT, *args, timeout=timeout, check=check, env=env)


@functools.cache
def seeded(version: str, cache: Path) -> None:
    """seed_cache once per process: cluster_sh runs for every scontrol a test sends."""
    seed_cache(version, cache)


def scale_env(nodes: int, cache: Path, rundir: str, port_base: int) -> dict[str, str]:
    """cluster.sh's environment for a cluster beside the test clusters whose slurm.conf also
    defines ``nodes`` nodes s1..sN that never register: its own cache (seed_cache), run
    directory and ports."""
    return {
        "NODELEDGER_CACHE": str(cache),
        "NODELEDGER_RUNDIR": rundir,
        "NODELEDGER_SLURM_PORT_BASE": str(port_base),
        "NODELEDGER_SLURM_SCALE_NODES": str(nodes),
    }


def seed_cache(version: str, cache: Path, main: Path | None = None) -> None:
    """Copy the test cluster's built chroot into ``cache`` instead of building Slurm a
    second time (the copy is keyed by the same recipe revision)."""
    for built in (main or main_cache()).glob(f"slurm-{version}-trixie-r*"):
        target = cache / built.name
        if built.is_dir() and (built / ".complete").exists() and not target.exists():
            cache.mkdir(parents=True, exist_ok=True)
            partial = cache / f"{built.name}.copying"
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run(["cp", "-a", str(built), str(partial)], check=True)
            shutil.rmtree(partial / "srv" / "run", ignore_errors=True)  # the cluster's state
            partial.rename(target)


def k8s_counts(gres: str) -> dict[str, int]:
    """k8s GRES totals in a node's GRES string as Slurm shows it (scaled: 30K = 30720;
    absent = 0)."""
    counts = {"k8scpu": 0, "k8smemory": 0, "k8sgpu": 0}
    for entry in gres.split(","):
        key, _, count = entry.partition(":")
        if key in counts:
            number = count.split("(")[0]
            scale = 1024 ** (" KMGT".index(number[-1]) if number[-1] in "KMGT" else 0)
            counts[key] = int(number.rstrip("KMGT")) * scale
    return counts


@dataclass(frozen=True)
class SlurmCluster:
    version: str  # the release series: "24.11", "26.05"
    release: str  # the exact version the daemons report, e.g. "26.05.3"
    url: str
    token_file: Path
    user: str
    # n1..nN: three unless cluster.sh ran with NODELEDGER_SLURM_NODES.
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    # The job hint hook's configuration (slurm-plugins/hooks/nodeledger-job-hint), seen
    # from the host; absent: the hook does nothing.
    hint_config: Path | None = None
    # cluster.sh's environment beyond the version (a cluster of its own: scale_env).
    script_env: Mapping[str, str] = field(default_factory=dict)
    chroot: Path | None = None  # the daemons' root, to find this cluster's processes

    @classmethod
    def from_env(cls, version: str, script_env: Mapping[str, str] | None = None) -> SlurmCluster:
        exports = cluster_sh(version, "env", env=script_env)
        env = dict(re.findall(r"^export (\w+)=(.*)$", exports, re.MULTILINE))
        return cls(
            version,
            env["SLURM_VERSION"],
            env["SLURMRESTD_URL"],
            Path(env["SLURM_JWT_TOKEN_FILE"]),
            env["SLURM_USER"],
            nodes=tuple(env.get("SLURM_NODES", "n1,n2,n3").split(",")),
            hint_config=Path(env["SLURM_HINT_CONFIG"]) if "SLURM_HINT_CONFIG" in env else None,
            script_env=dict(script_env or {}),
            chroot=Path(env["SLURM_CHROOT"]) if "SLURM_CHROOT" in env else None,
        )

    def script(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        return cluster_sh(self.version, *args, timeout=timeout, check=check, env=self.script_env)

    def script_in_background(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["bash", str(SCRIPT), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **self.script_env, "NODELEDGER_SLURM_VERSION": self.version},
        )

    @property
    def service_env(self) -> dict[str, str]:
        """The environment that points a `nodeledger serve` at this cluster, Slurm on."""
        return {
            "NODELEDGER_SLURM_ENABLED": "true",
            "NODELEDGER_SLURM_URL": self.url,
            "NODELEDGER_SLURM_TOKEN_FILE": str(self.token_file),
        }

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def run(self, *args: str, check: bool = True) -> str:
        """A command inside the cluster, as `cluster.sh exec` runs it (the daemons' mount
        namespace, the chroot, a clean environment), started from here: the tests send
        thousands of them, and the script costs a dozen processes each."""
        command = ["nsenter", "-t", str(self.anchor()), "-m", "chroot", str(self.chroot)]
        command += ["/usr/bin/env", "-i", *IN_CLUSTER_ENV, *args]
        what = f"{' '.join(args)} on Slurm {self.version}"
        return run_command(command, what, timeout=60, check=check, cwd="/")

    def anchor(self) -> int:
        """A process in the daemons' mount namespace (their munged), as cluster.sh finds it;
        remembered while it runs."""
        assert self.chroot is not None, "cluster.sh env names no SLURM_CHROOT"
        pid = _ANCHORS.get(self.chroot)
        if pid is not None and self._argv(pid)[:1] == [MUNGED]:
            return pid
        pids = [pid for pid, argv in self.processes().items() if argv[0] == MUNGED]
        if not pids:
            raise RuntimeError(f"the Slurm {self.version} cluster is not running (cluster.sh up)")
        _ANCHORS[self.chroot] = pids[0]
        return pids[0]

    def _argv(self, pid: int) -> list[str]:
        """``pid``'s command line if it is one of this cluster's processes, else []."""
        try:
            if os.readlink(f"/proc/{pid}/root") != str(self.chroot):
                return []
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []  # gone, or a zombie

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
        """The node's k8s GRES totals as Slurm shows them."""
        return k8s_counts(self.node(name)["gres"])

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

    def processes(self) -> dict[int, list[str]]:
        """This cluster's processes (another cluster may run beside it): pid -> argv."""
        assert self.chroot is not None, "cluster.sh env names no SLURM_CHROOT"
        found = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (argv := self._argv(int(entry))):
                found[int(entry)] = argv
        return found

    def ctld_pids(self) -> list[int]:
        """This cluster's slurmctld processes."""
        return [pid for pid, argv in self.processes().items() if argv[0] == "/usr/sbin/slurmctld"]

    def kill_ctld(self) -> None:
        """slurmctld killed with SIGKILL: it saves nothing on the way out."""
        for pid in self.ctld_pids():
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not self.ctld_pids(), 20, what="slurmctld gone")

    def start_ctld(self) -> None:
        """slurmctld started again (after ``kill_ctld``); returns once the nodes are usable.
        A job started after slurmctld last saved its state comes back PENDING while it runs
        on its node; slurmctld allocates it again, finds it there, drains the node
        ("Duplicate jobid") and requeues the job (26.05.3): what an operator resumes after
        a controller crash, and so does this."""
        self.run("/usr/sbin/slurmctld")

        def usable() -> bool:
            for line in self.run("sinfo", "-h", "-N", "-o", "%N|%E", check=False).split("\n"):
                node, _, reason = line.partition("|")
                if reason.startswith("Duplicate jobid"):
                    self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            return self.nodes_usable()

        wait_until(usable, 60, interval=0.2, what="nodes usable again")

    def nodes_usable(self) -> bool:
        states = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).split("\n")
        usable = [s for s in states if s.split()[-1:] in (["idle"], ["mixed"], ["allocated"])]
        return len(usable) >= len(self.nodes)

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
        "n3": f"k8scpu:16,k8smemory:32000,k8sgpu:4,{N3_GPUS}",
    }

    @classmethod
    def full_gres(cls, node: str) -> str:
        """A node's GRES as the cluster starts: n4..nN are like n1 (no GPUs)."""
        return cls.FULL_GRES.get(node, cls.FULL_GRES["n1"])

    def rest(self, method: str, path: str, *, timeout: float = 10, **kwargs: Any) -> httpx.Response:
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token}
        url = f"{self.url}/slurm/{REST_API}/{path}"
        return httpx.request(method, url, headers=headers, timeout=timeout, **kwargs)

    def submit_held(self, count: int, partition: str) -> float:
        """``count`` held jobs (2 CPUs, 1000 MB each) in ``partition``, 16 at a time through
        slurmrestd; jobs submitted per second."""
        body = {
            "job": {
                "name": "held",
                "partition": partition,
                "hold": True,
                "cpus_per_task": 2,
                "memory_per_node": {"set": True, "number": 1000},
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "script": "#!/bin/sh\nsleep 600\n",
            }
        }
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token}
        limits = httpx.Limits(max_connections=16)
        with httpx.Client(base_url=self.url, headers=headers, timeout=60, limits=limits) as rest:

            def submit(_: int) -> None:
                rest.post(f"/slurm/{REST_API}/job/submit", json=body).raise_for_status()

            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(submit, range(count)))
            return count / (time.perf_counter() - started)

    def set_gres(self, node: str, gres: str) -> None:
        self.rest("POST", f"node/{node}", json={"gres": gres}).raise_for_status()

    def update_nodes(self, hostlist: str, **update: str) -> None:
        """One update (``gres=``, ``extra=``, ...) of every node in ``hostlist``
        (``s[1-1000]``)."""
        self.rest("POST", "nodes/", json={"name": [hostlist], **update}).raise_for_status()

    def reset(self) -> None:
        """No jobs, full counts, no nodeledger token in ``extra``, every node usable."""
        self.cancel_all()
        for node in self.nodes:
            gres = self.full_gres(node)
            self.rest(
                "POST", f"node/{node}", json={"gres": gres, "extra": "", "comment": ""}
            ).raise_for_status()
            if {"DRAIN", "DOWN"} & set(self.node(node)["state"]):
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
