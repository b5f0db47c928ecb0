"""Shared rule for real components: skip locally when one is missing, fail in CI."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def newest(releases: Iterable[str]) -> str:
    """The newest of release numbers such as "1.37" or "26.05" ("" when none)."""
    return max(releases, key=lambda v: tuple(map(int, v.split("."))), default="")


def unavailable(component: str, why: str) -> NoReturn:
    """A real component is missing: a failure in CI, a skip on a developer's machine."""
    message = f"{component} unavailable: {why}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


T = TypeVar("T")


def run_script(
    script: Path,
    *args: str,
    timeout: float = 300,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> str:
    """Run a testenv script (bash), with ``env`` added to ours; its stdout, or RuntimeError
    with its stderr."""
    return run_command(
        ["bash", str(script), *args],
        f"{script.name} {' '.join(args)}",
        timeout=timeout,
        check=check,
        env={**os.environ, **env} if env else None,
    )


def run_command(
    command: list[str],
    what: str,
    *,
    timeout: float,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """``command``'s stdout, or RuntimeError naming ``what`` with its stderr."""
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd=cwd
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def wait_until(
    predicate: Callable[[], T], timeout: float, interval: float = 0.1, what: str = "condition"
) -> T:
    """The predicate's first truthy value; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
