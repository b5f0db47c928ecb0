"""node_features/k8s_resources' node watcher inside real slurmctld, against a service that
never answers: the hook it runs holds none of slurmctld's descriptors, and a hook that hangs
holds the next node hint up by at most the plugin's bound (HOOK_MS), after which the next
hint asks for every node (the hung one's names are lost)."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm

HOOK_BOUND = 10.0  # seconds: HOOK_MS in node_features_k8s_resources.c
SLACK = 5.0  # a pass (0.2 s), a spawn, and this test's polling, on a busy machine


@contextmanager
def silent_service() -> Iterator[str]:
    """An http URL on loopback that takes connections (the kernel does) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@contextmanager
def hook_config(slurm: SlurmCluster, url: str, timeout: int) -> Iterator[None]:
    """The hint hook posts to ``url`` with ``timeout`` seconds per attempt (two attempts)."""
    config = slurm.hint_config
    if config is None:
        pytest.fail("this Slurm test cluster has no hint hook (testenv/slurm/cluster.sh)")
    config.write_text(f"url={url}\ntimeout={timeout}\n")
    try:
        yield
    finally:
        config.unlink(missing_ok=True)
        kill_hooks(slurm)


def hooks(slurm: SlurmCluster) -> dict[int, str]:
    """The hook's node-hint runs in this cluster: pid -> the nodes it posts."""
    return {
        pid: args[args.index("--post-nodes") + 1]
        for pid, args in slurm.processes().items()
        if len(args) > 2 and args[1].endswith("/nodeledger-job-hint") and "--post-nodes" in args
    }


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def kill_hooks(slurm: SlurmCluster) -> None:
    """Hooks left hanging (a plugin without the bound): each with its children, by pid."""
    for pid in hooks(slurm):
        for victim in [*children(pid), pid]:
            with suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)


def sockets(pid: int) -> dict[str, str]:
    """The sockets among ``pid``'s descriptors: link target -> descriptor."""
    found = {}
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found[target] = fd.name
    return found


def hook_for(slurm: SlurmCluster, node: str, *, besides: int | None = None) -> int | None:
    """A running hook whose hint names ``node`` (or every node), other than ``besides``."""
    for pid, nodes in hooks(slurm).items():
        if pid != besides and (nodes == "*" or node in nodes.split(",")):
            return pid
    return None


def drain(slurm: SlurmCluster, node: str, reason: str = "watcher test") -> None:
    slurm.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")


def drained_and_hinted(slurm: SlurmCluster, node: str) -> int:
    """Drain ``node`` until a hook posts it; its pid. A slurmctld that just started has its
    watcher only remember the nodes it sees first, which may already be drained: each new
    reason (a new reason time, seconds later; the same one again changes nothing) is a
    change it hints."""
    drains: list[float] = []

    def hinted() -> int | None:
        due = not drains or time.monotonic() - drains[-1] > 2
        if (pid := hook_for(slurm, node)) is None and due:
            drain(slurm, node, f"watcher test {len(drains)}")
            drains.append(time.monotonic())
        return pid

    pid = wait_until(hinted, 30, interval=0.05, what=f"{node}'s hint")
    assert pid is not None
    return pid


def test_the_hook_holds_none_of_slurmctlds_descriptors(slurm: SlurmCluster) -> None:
    """After a reconfigure slurmctld's listening sockets lack CLOEXEC (24.11
    controller.c:1321): a hook that inherited them would keep port 6817 past slurmctld."""
    slurm.reconfigure()
    with silent_service() as url, hook_config(slurm, url, timeout=30):
        hook = drained_and_hinted(slurm, "n1")
        held = {**sockets(hook)}
        for child in children(hook):  # curl
            held.update(sockets(child))
        ctld = {}
        for pid in slurm.ctld_pids():
            ctld.update(sockets(pid))
        shared = {target: held[target] for target in held.keys() & ctld.keys()}
        assert not shared, f"the hook (pid {hook}) holds slurmctld's sockets: {shared}"
        std = [os.readlink(f"/proc/{hook}/fd/{fd}") for fd in (0, 1, 2)]
        assert std == [f"{slurm.chroot}/dev/null"] * 3


def test_a_hook_that_hangs_holds_the_next_node_hint_up_at_most_its_bound(
    slurm: SlurmCluster,
) -> None:
    """Each attempt of the hook may take 600 s here: only the plugin's bound ends it."""
    with silent_service() as url, hook_config(slurm, url, timeout=600):
        first = drained_and_hinted(slurm, "n1")
        started = time.monotonic()
        drain(slurm, "n2")
        after = wait_until(
            lambda: hook_for(slurm, "n2", besides=first),
            HOOK_BOUND + 30,
            interval=0.05,
            what="the next node hint",
        )
        took = time.monotonic() - started
        assert after is not None
        posts = hooks(slurm).get(after)
        print(f"Slurm {slurm.version}: next node hint {took:.2f}s after a hook that hangs")
        assert took <= HOOK_BOUND + SLACK
        assert first not in hooks(slurm)  # killed, not left behind
        assert posts == "*"  # n1's hint was lost: the service lists every node
