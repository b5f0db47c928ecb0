"""Shared rule for real components: skip locally when one is missing, fail in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(component: str, why: str) -> NoReturn:
    """A real component is missing: a failure in CI, a skip on a developer's machine."""
    message = f"{component} unavailable: {why}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
