"""The suite's workers get directories and ports of their own (tests/support/workers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import workers

ENV = (
    "PYTEST_XDIST_WORKER",
    "NODELEDGER_TEST_FIRST_WORKER",
    "NODELEDGER_CACHE",
    "NODELEDGER_MAIN_CACHE",
    "NODELEDGER_RUNDIR",
    "NODELEDGER_MAIN_RUNDIR",
    "NODELEDGER_PORT_OFFSET",
    "NODELEDGER_SLURM_PORT_BASE",
    "NODELEDGER_KUBE_PORT_BASE",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    main = tmp_path / "cache"
    (main / "slurm-26.05-trixie-r1" / "usr").mkdir(parents=True)
    (main / "kube-v1.37.2-etcd-v3.7.3-r4").mkdir()
    monkeypatch.setenv("NODELEDGER_CACHE", str(main))
    monkeypatch.setenv("NODELEDGER_RUNDIR", str(tmp_path / "run"))
    return monkeypatch


def test_worker_0_keeps_the_defaults(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("PYTEST_XDIST_WORKER", "gw0")
    workers.isolate()
    assert workers.cache() == tmp_path / "cache"
    assert workers.rundir() == tmp_path / "run"
    assert workers.port(17200) == 17200


def test_a_worker_has_its_own_directories_ports_and_chroots(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env.setenv("PYTEST_XDIST_WORKER", "gw1")
    env.setenv("NODELEDGER_SLURM_PORT_BASE", "30000")
    workers.isolate()
    own = tmp_path / "cache-worker-1"
    assert workers.cache() == own
    assert workers.main_cache() == tmp_path / "cache"
    assert workers.rundir() == tmp_path / "run-worker-1"
    assert workers.main_rundir() == tmp_path / "run"
    assert workers.port(17200) == 17200 + workers.PORT_STRIDE
    assert int(os.environ["NODELEDGER_SLURM_PORT_BASE"]) == 30000 + workers.PORT_STRIDE
    # Builds are linked; a chroot is not (a cluster's state lives inside it: seed_cache
    # copies it when the worker first starts that cluster).
    assert (own / "kube-v1.37.2-etcd-v3.7.3-r4").is_symlink()
    assert not (own / "slurm-26.05-trixie-r1").exists()
    workers.isolate()  # a second call (a test process started again) changes nothing
    assert workers.cache() == own
    assert workers.port(0) == workers.PORT_STRIDE


def test_the_first_worker_number_moves_every_worker(env: pytest.MonkeyPatch) -> None:
    env.setenv("NODELEDGER_TEST_FIRST_WORKER", "1")
    env.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert workers.number() == 2
    env.setenv("PYTEST_XDIST_WORKER", "gw2")
    with pytest.raises(RuntimeError, match="at most 3 workers"):
        workers.isolate()


def test_the_workers_ports_stay_below_the_ephemeral_range() -> None:
    highest_default = 17800  # the scale-test cluster's slurmd ports (17600 + 200)
    top = highest_default + (workers.MAX_WORKERS - 1) * workers.PORT_STRIDE
    assert top < 32768  # Linux's first ephemeral port: a client's socket could take ours
    assert highest_default - 12379 < workers.PORT_STRIDE  # etcd's default: ranges disjoint


@pytest.mark.slow  # a pytest of its own on three workers
def test_xdist_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    """What `--dist loadgroup` must do for the deploy tests and the older minors' (a
    pytest that xdist cannot rename items in spreads them: pytest 9.2 with xdist 3.8)."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        if item.name.startswith('test_grouped'):\n"
        "            item.add_marker(pytest.mark.xdist_group('together'))\n"
    )
    (tmp_path / "test_spread.py").write_text(
        "import os, pathlib\n"
        + "".join(
            f"def test_{kind}_{i}():\n"
            f"    with open(pathlib.Path(__file__).with_name('ran'), 'a') as ran:\n"
            f"        ran.write('{kind} ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
            for kind in ("grouped", "free")
            for i in range(6)
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-q",
         "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split() for line in (tmp_path / "ran").read_text().splitlines()]
    assert len(ran) == 12
    assert len({worker for kind, worker in ran if kind == "grouped"}) == 1, ran
