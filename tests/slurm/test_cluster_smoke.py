"""The real Slurm clusters (one per supported release) the other Slurm tests rely on."""

from __future__ import annotations

import httpx
import pytest

from app.slurm.client import SlurmClient
from app.slurm.payloads import parse_job, parse_node
from app.slurm.tokens import FileToken
from tests.support.slurm_cluster import N3_GPUS, REST_API, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm
OFFERED_APIS = {  # what each release's slurmrestd offers, oldest first
    "24.11": ("v0.0.40", "v0.0.41", "v0.0.42"),
    "25.11": ("v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44"),
    "26.05": ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"),
}
NEWEST_API = {release: apis[-1] for release, apis in OFFERED_APIS.items()}


def test_the_daemons_are_the_release_under_test(slurm_cluster: SlurmCluster) -> None:
    """Plugins load only into the exact version they were built for: the cluster's daemons
    must be the release its plugins were compiled against."""
    assert slurm_cluster.release.startswith(slurm_cluster.version + ".")
    # Debian's build says "slurm-wlm 24.11.5", upstream's "slurm 26.05.3".
    version = slurm_cluster.run("scontrol", "--version").split()[-1]
    assert version == slurm_cluster.release
    config = slurm_cluster.run("scontrol", "show", "config")
    assert "k8s_resource_completion" in config
    assert "node_features/k8s_resources" in config


def test_the_client_speaks_the_newest_api_the_release_offers(slurm_cluster: SlurmCluster) -> None:
    client = SlurmClient(slurm_cluster.url, FileToken(slurm_cluster.token_file))
    try:
        assert client.version == NEWEST_API[slurm_cluster.version]
        listing = client.get_nodes()
        assert listing is not None
        assert {n.name for n in listing.items} == set(slurm_cluster.nodes)
    finally:
        client.close()


def test_nodes_are_idle_with_full_gres(slurm_cluster: SlurmCluster) -> None:
    for name in slurm_cluster.nodes:
        node = slurm_cluster.node(name)
        assert node["cpus"] == 16
        assert node["real_memory"] == 32000
        assert "k8scpu:16" in node["gres"]
    assert N3_GPUS in slurm_cluster.node("n3")["gres"]


def test_slurmrestd_requires_the_token(slurm_cluster: SlurmCluster) -> None:
    url = f"{slurm_cluster.url}/slurm/{REST_API}/nodes/"
    headers = {"X-SLURM-USER-NAME": slurm_cluster.user}
    assert (
        httpx.get(url, headers={**headers, "X-SLURM-USER-TOKEN": slurm_cluster.token}).status_code
        == 200
    )
    assert httpx.get(url, headers={**headers, "X-SLURM-USER-TOKEN": "garbage"}).status_code in (
        401,
        511,
    )


def test_a_job_runs_and_completes(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.sbatch(
        "-w", "n1", "-c", "2", "--mem=100", "--gres=k8scpu:2,k8smemory:100", "--wrap", "sleep 1"
    )
    wait_until(lambda: slurm_cluster.job_state(job) == "COMPLETED", 30, what=f"job {job} done")


def test_listings_decoded_to_their_read_fields_equal_a_full_parse(slurm: SlurmCluster) -> None:
    """Listings are decoded into the fields the service reads only (app.slurm.payloads);
    on every API version the release offers, that gives exactly what parsing the whole
    answer gives, for a running, a GPU and a pending job and every node."""
    ours = {
        slurm.sbatch("-w", "n1", "-c", "2", "--mem=500", "--wrap", "sleep 600"),
        slurm.sbatch("-w", "n3", "-c", "2", "--mem=500", "--gres=gpu:1", "--wrap", "sleep 600"),
        slurm.sbatch("-H", "-c", "2", "--mem=500", "--wrap", "sleep 600"),
    }
    wait_until(
        lambda: len(slurm.run("squeue", "-h", "-t", "R", "-o", "%i").split()) == 2,
        30,
        what="two jobs running",
    )
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    for api in OFFERED_APIS[slurm.version]:
        client = SlurmClient(slurm.url, FileToken(slurm.token_file), api_version=api)
        try:
            jobs, nodes = client.get_jobs(), client.get_nodes()
        finally:
            client.close()
        raw = {
            kind: httpx.get(f"{slurm.url}/slurm/{api}/{kind}/", headers=headers).json()[kind]
            for kind in ("jobs", "nodes")
        }
        assert jobs is not None
        assert nodes is not None
        # Jobs that ended long ago may be purged between the two reads: compare the others.
        decoded = {j.job_id: j for j in jobs.items}
        parsed = {j.job_id: j for j in map(parse_job, raw["jobs"])}
        both = decoded.keys() & parsed.keys()
        assert ours <= both, api
        assert {i: decoded[i] for i in both} == {i: parsed[i] for i in both}, api
        assert nodes.items == tuple(parse_node(n) for n in raw["nodes"]), api
        running = [j for j in jobs.items if "RUNNING" in j.states]
        assert len(running) == 2, api
        assert all(j.allocations for j in running), api
        # Where jobs may run, on both sides (the headroom's give-back, app.slurm.state); the
        # listing may still hold an earlier test's ended job of another partition.
        assert all(j.partitions == {"debug"} for j in jobs.items if j.job_id in ours), api
        assert all("debug" in n.partitions for n in nodes.items), api
