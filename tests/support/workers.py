"""The suite's workers (pytest-xdist): each has real components of its own.

Worker N > 0 runs its Slurm clusters, control planes and PostgreSQL beside worker 0's:
its own run directory (NODELEDGER_RUNDIR), ports moved by N * PORT_STRIDE
(NODELEDGER_PORT_OFFSET, which the cluster scripts add to their defaults and the tests to
their fixed bases), and its own cache (NODELEDGER_CACHE): a Slurm cluster keeps its state
inside its chroot, so each worker has a copy of the chroots (made once, kept); every other
cached build is a link to the main cache. Worker 0, and a run without workers, use the
defaults: the clusters a developer already has up are the ones it reuses.
"""

from __future__ import annotations

import os
from pathlib import Path

# Each worker's ports span the defaults' range (12379 to about 17800) once more above the
# previous worker's, below Linux's ephemeral ports (32768) for up to three workers.
PORT_STRIDE = 6000
MAX_WORKERS = 3
SLURM_CHROOTS = "slurm-*-trixie-r*"  # copied into a worker's cache by seed_cache, never linked


def number() -> int:
    """This process's worker number: 0 for gw0 and for a run without workers, counted from
    NODELEDGER_TEST_FIRST_WORKER (e.g. 1: a run that leaves worker 0's components, a
    developer's, to others)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")) + int(os.environ.get("NODELEDGER_TEST_FIRST_WORKER", "0"))


def port(base: int) -> int:
    """A fixed port base of a test's own cluster, moved to this worker's range."""
    return base + int(os.environ.get("NODELEDGER_PORT_OFFSET", "0"))


def cache() -> Path:
    """Where this worker's cluster scripts cache their builds (NODELEDGER_CACHE)."""
    given = os.environ.get("NODELEDGER_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "nodeledger"


def rundir() -> Path:
    """Where this worker's clusters keep their runtime links (NODELEDGER_RUNDIR)."""
    return Path(os.environ.get("NODELEDGER_RUNDIR", "/tmp/nodeledger"))


def main_rundir() -> Path:
    """The run directory before isolate(): a cluster with real nodes (one per machine, the
    deploy tests') keeps it whichever worker starts it, so the next run finds it there."""
    given = os.environ.get("NODELEDGER_MAIN_RUNDIR")
    return Path(given) if given else rundir()


def main_cache() -> Path:
    """The cache `make testenv` built: the chroots a worker's copies come from."""
    given = os.environ.get("NODELEDGER_MAIN_CACHE")
    return Path(given) if given else cache()


def isolate() -> None:
    """Point this worker's cluster scripts at its own directories and ports (before any
    fixture starts a component). A no-op for worker 0."""
    n = number()
    if n == 0 or "NODELEDGER_MAIN_CACHE" in os.environ:  # worker 0, or isolated already
        return
    if n >= MAX_WORKERS:
        raise RuntimeError(f"worker {n}: at most {MAX_WORKERS} workers fit the port ranges")
    main, run = cache(), rundir()
    own = main.with_name(f"{main.name}-worker-{n}")
    link_cache(main, own)
    shift = n * PORT_STRIDE
    os.environ.update(
        NODELEDGER_MAIN_CACHE=str(main),
        NODELEDGER_MAIN_RUNDIR=str(run),
        NODELEDGER_CACHE=str(own),
        NODELEDGER_RUNDIR=str(run.with_name(f"{run.name}-worker-{n}")),
        NODELEDGER_PORT_OFFSET=str(int(os.environ.get("NODELEDGER_PORT_OFFSET", "0")) + shift),
    )
    for given in ("NODELEDGER_SLURM_PORT_BASE", "NODELEDGER_KUBE_PORT_BASE"):
        if given in os.environ:
            os.environ[given] = str(int(os.environ[given]) + shift)


def link_cache(main: Path, cache: Path) -> None:
    """``cache`` links every entry of ``main`` but the Slurm chroots (seed_cache copies
    those when a cluster first starts)."""
    cache.mkdir(parents=True, exist_ok=True)
    chroots = set(main.glob(SLURM_CHROOTS))
    for entry in main.iterdir() if main.is_dir() else ():
        target = cache / entry.name
        if entry in chroots or target.exists() or target.is_symlink():
            continue
        target.symlink_to(entry)
