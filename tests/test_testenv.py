"""The Go builds of testenv/kube share what they can: helm's modules are at the versions the
newest control plane selects, so that on a new machine helm's build reuses the control
plane's compiled packages instead of compiling its own (docs/development.md, "What a new
machine spends where")."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.kube_cluster import SUPPORTED

TOOLS = Path(__file__).resolve().parent.parent / "testenv" / "kube" / "tools"
REQUIRE = re.compile(r"^\s*(?:require\s+)?(\S+)\s+(v\S+)(?:\s*//.*)?$", re.M)
REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+\S+\s+(v\S+)", re.M)


def selected(go_mod: Path) -> dict[str, str]:
    """Each module's version in ``go_mod``: its requirement, or the version it is replaced
    by (k8s.io/kubernetes's staging modules)."""
    text = go_mod.read_text()
    return dict(REQUIRE.findall(text)) | dict(REPLACE.findall(text))


def test_helm_shares_the_newest_control_planes_module_versions() -> None:
    kube = selected(TOOLS / f"kube-{SUPPORTED[0]}" / "go.mod")
    helm = selected(TOOLS / "helm" / "go.mod")
    shared = sorted(set(kube) & set(helm))
    differ = [f"{m}: helm {helm[m]}, kube {kube[m]}" for m in shared if helm[m] != kube[m]]
    assert len(shared) > 50, shared  # client-go and its dependencies at least
    assert not differ, "align tools/helm/go.mod with the control plane's: " + "; ".join(differ)
