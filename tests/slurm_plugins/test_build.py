"""The plugins build against every supported Slurm release's configured tree, with the
node_features ops that release lists, and pass their C unit tests plain and under valgrind.
25.11 has no test cluster: this is what proves it; 24.11 and 26.05 also load them."""

from __future__ import annotations

import re

import pytest

from tests.support.slurm_cluster import cluster_sh

pytestmark = pytest.mark.slurm

RELEASES = {"24.11": "24.11.5", "25.11": "25.11.7", "26.05": "26.05.3"}


@pytest.mark.parametrize("version", RELEASES)
def test_plugins_build_and_pass_their_c_tests(version: str) -> None:
    out = cluster_sh(version, "plugins-check", timeout=1800)
    release = RELEASES[version]
    assert f"as Slurm {release} lists them" in out, out
    assert len(re.findall(r"ok: \d+ calculation cases, 0 failures", out)) == 2, out
    assert f"plugins built and tested against Slurm {release}" in out
