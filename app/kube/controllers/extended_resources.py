"""Whether plain GPU pods are held by device (KEP-5004): a DeviceClass must map the GPU
extended resource (``spec.extendedResourceName``, KEP-5004) for kube-scheduler to allocate
their requests through DRA. Leader-only, looked at once per term and every
``resync_period`` (a class may be created later); when none maps it (Kubernetes before
1.36, the DRAExtendedResource gate off, or no such class), one log line and ``note``
(hence /readyz) say that such pods stay counted. What the bind and pod accounting do needs
no answer from here: they read each pod's generated claim when it has one."""

from __future__ import annotations

import logging

from app.core.claims import CLASSES_PATH, class_mapping, mapping_note
from app.kube.client import KubeClient, KubeError
from app.loops import Loop, Stop

log = logging.getLogger(__name__)


class ExtendedResourceMapping:
    def __init__(self, client: KubeClient, *, gpu_resource: str, resync_period: float) -> None:
        self.client = client
        self.gpu_resource = gpu_resource
        self.classes: tuple[str, ...] | None = None  # None: not looked yet this term
        self.note: str | None = None  # what it falls back to, for /readyz
        self._loop = Loop("extended-resources", self.step, interval=resync_period,
                          logger=log, what="the GPU extended-resource mapping")  # fmt: skip

    def run(self, stop: Stop) -> None:
        self.classes = None
        self._loop.run(stop)

    def step(self) -> None:
        try:
            listed, _ = self.client.list(CLASSES_PATH, class_mapping)
        except KubeError as exc:
            what = f"plain {self.gpu_resource} pods"
            note: str | None = f"whether {what} are held by device is unknown: {exc}"
            if note != self.note:
                log.warning("%s", note)
            self.classes, self.note = None, note
            return
        mapped = any(resource == self.gpu_resource for _, resource in listed)
        classes, note = mapping_note(listed, self.gpu_resource, "" if mapped else self._version())
        if classes != self.classes:  # said once per term and change
            if note:
                log.warning("%s", note)
            else:
                log.info("plain %s pods held by device through DeviceClass %s (KEP-5004)",
                         self.gpu_resource, ", ".join(classes))  # fmt: skip
        self.classes, self.note = classes, note

    def _version(self) -> str:
        try:
            return str(self.client.request("GET", "/version").get("gitVersion") or "")
        except KubeError:
            return ""
