"""The kube-scheduler extender's wire types (k8s.io/kube-scheduler/extender/v1).

Field names are the Go struct's (the types carry no JSON tags, so kube-scheduler sends
``Pod``, ``NodeNames``, ``PodUID``...). Only what the service reads is typed; the rest of
a Pod or Node passes through untouched. A body that does not fit answers 422 naming the
field, never 500.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# A Kubernetes quantity as it arrives in JSON: "500m", "2Gi", or a bare number.
Quantity = str | int | float


class _Wire(BaseModel):
    """Kubernetes objects carry far more than is read here: keep it, unvalidated."""

    model_config = ConfigDict(extra="allow")


class ObjectMeta(_Wire):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class ResourceRequirements(_Wire):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class Container(_Wire):
    name: str = ""
    resources: ResourceRequirements | None = None
    restartPolicy: str | None = None


class PodSpec(_Wire):
    containers: list[Container] = Field(default_factory=list)
    initContainers: list[Container] | None = None
    overhead: dict[str, Quantity] | None = None
    resources: ResourceRequirements | None = None
    nodeName: str | None = None


class KubePod(_Wire):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec = Field(default_factory=PodSpec)

    def as_api_object(self) -> dict[str, Any]:
        """The pod as the Kubernetes API would give it (what app.core.pods reads)."""
        return self.model_dump(exclude_none=True)


class KubeNode(_Wire):
    metadata: ObjectMeta


class NodeList(_Wire):
    items: list[KubeNode] = Field(default_factory=list)

    def named(self, names: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The list of the nodes called ``names``, each exactly as it was sent."""
        wanted = set(names)
        return {
            "items": [
                n.model_dump(exclude_unset=True) for n in self.items if n.metadata.name in wanted
            ]
        }


class ExtenderArgs(_Wire):
    Pod: KubePod
    Nodes: NodeList | None = None  # when nodeCacheCapable is false
    NodeNames: list[str] | None = None  # when nodeCacheCapable is true

    @property
    def candidates(self) -> list[str]:
        if self.NodeNames is not None:
            return self.NodeNames
        return [n.metadata.name for n in self.Nodes.items] if self.Nodes else []


class ExtenderFilterResult(BaseModel):
    # The fitting Node objects as they were sent, when they were sent as objects.
    Nodes: dict[str, list[dict[str, Any]]] | None = None
    NodeNames: list[str] = Field(default_factory=list)
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(BaseModel):
    Host: str
    Score: int = Field(ge=0, le=10)  # kube-scheduler's MaxExtenderPriority


# Kubernetes object names (apimachinery validation): a DNS-1123 subdomain (pods, nodes) or
# label (namespaces). bind puts them into API paths, so anything else (a "/" or "..")
# would address another resource; kube-scheduler never sends such names.
SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
UID = r"^[A-Za-z0-9][-A-Za-z0-9_.:]*$"  # a UUID; the holder id, so as the REST API's ids


class ExtenderBindingArgs(_Wire):
    PodName: str = Field(max_length=253, pattern=SUBDOMAIN)
    PodNamespace: str = Field(max_length=63, pattern=LABEL)
    PodUID: str = Field(max_length=253, pattern=UID)
    Node: str = Field(max_length=253, pattern=SUBDOMAIN)


class ExtenderBindingResult(BaseModel):
    Error: str = ""
