"""Kubernetes integration settings (NODELEDGER_KUBE_*)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class KubeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_KUBE_", extra="ignore")

    enabled: bool = Field(default=False, description="Run the controllers and the extender")
    kubeconfig: Path | None = Field(default=None, description="Default: in-cluster config")
    node_selector: str = Field(default="", description="Label selector of the managed Nodes")
    slurm_node_label: str = Field(
        default="nodeledger.io/slurm-node", description="Node label naming its Slurm node"
    )
    cluster_name: str = Field(default="default", description="GenericNode spec.clusterName")
    gpu_resource: str = Field(default="nvidia.com/gpu", description="Extended resource of GPUs")
    gpu_drivers: str = Field(
        default="",
        description="DRA drivers whose devices are co-managed GPUs, comma-separated (e.g. "
        "gpu.nvidia.com): the extender's bind holds a pod's allocated devices in Slurm "
        "before it binds (docs/gpu-identity.md); empty: off, no DRA reads",
    )
    gpu_index_attribute: str = Field(
        default="index",
        min_length=1,
        description="ResourceSlice device attribute (an int) that is the device's index N "
        "of /dev/nvidiaN and Slurm's gpu:gN (NVIDIA's driver: minor)",
    )
    gpu_device_taints: bool = Field(
        default=True,
        description="With gpu_drivers set and Kubernetes serving resource.k8s.io/v1 "
        "DeviceTaintRule (1.37 on): taint each co-managed GPU a Slurm job holds "
        "(nodeledger.io/slurm-job=<job id>, NoSchedule), so kube-scheduler allocates it to no "
        "pod (docs/gpu-identity.md); off: delete those rules",
    )
    slurm_taints: bool = Field(
        default=True,
        description="Taint a co-managed Node (nodeledger.io/slurm-unavailable, NoSchedule) while "
        "Slurm drains, downs or fails its node (docs/operations.md); off: remove those taints",
    )
    cordon_drains_slurm: bool = Field(
        default=True,
        description="A cordoned co-managed Node (kubectl cordon, kubectl drain) drains its Slurm "
        "node with a reason of nodeledger's; uncordon resumes it only while that drain is "
        "still nodeledger's (docs/operations.md)",
    )
    slurm_taints_evict: bool = Field(
        default=False,
        description="Taint a DOWN or FAIL node NoExecute instead, evicting its pods (a Slurm "
        "health check can be wrong: opt in)",
    )
    resync_period: float = Field(default=300.0, gt=0, description="Seconds between full resyncs")
    status_qps: float = Field(default=20.0, gt=0, description="GenericNode status writes per s")
    status_burst: int = Field(default=50, ge=1, description="GenericNode status write burst")
    binding_grace: float = Field(
        default=30.0, ge=0, description="Seconds a pod admission may wait for its pod to bind"
    )
    leader_election: bool = Field(default=True, description="One replica runs the controllers")
    lease_name: str = "nodeledger"
    lease_namespace: str = Field(default="default", description="Usually the pod's namespace")
    lease_duration: float = Field(default=15.0, gt=1)
    identity: str = Field(default_factory=socket.gethostname, description="Leader candidate id")
    request_timeout: float = Field(default=10.0, gt=0, description="Seconds per API call")
    extender_max_staleness: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="Seconds the extender's filter may miss ledger changes, this replica's "
        "binds included (0: none; more saves a database round trip per call)",
    )
    placeholders: bool = Field(
        default=False,
        description="Keep one placeholder pod per node whose CPU and memory requests are what "
        "the ledger keeps from pods there beyond the pods (Slurm's jobs, manual holdings, the "
        "cap), so that kube-scheduler filters nodes itself and calls the extender only to bind "
        "(docs/kubernetes.md); pair it with the chart's scheduler.placeholders",
    )
    placeholder_namespace: str = Field(
        default="", description="Namespace of the placeholder pods (default: lease_namespace)"
    )
    placeholder_image: str = Field(
        default="registry.k8s.io/pause:3.10.1",
        min_length=1,
        description="Image of the placeholder pods' one container (it only sleeps)",
    )
    placeholder_priority_class: str = Field(
        default="",
        description="PriorityClass of the placeholder pods: above every pod's, so that no "
        "scheduler preempts them (the chart creates one); empty: none",
    )
    list_page_size: int = Field(
        default=2000, ge=1, description="Objects per page of a LIST (limit + continue)"
    )

    @field_validator("gpu_drivers")
    @classmethod
    def _drivers(cls, value: str) -> str:
        return ",".join(d.strip() for d in value.split(",") if d.strip())

    @model_validator(mode="after")
    def _placeholder_namespace(self) -> Self:
        # Resolved here, so that the one name always holds the namespace the pods are in.
        if not self.placeholder_namespace:
            self.placeholder_namespace = self.lease_namespace
        return self

    @property
    def gpu_driver_names(self) -> frozenset[str]:
        """The co-managed DRA drivers (``gpu_drivers``), empty when the feature is off."""
        return frozenset(filter(None, self.gpu_drivers.split(",")))
