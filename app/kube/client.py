"""The Kubernetes API calls the service makes, on plain JSON (no generated models), with a
timeout on every call and one error type. Built on the official client's ApiClient so
kubeconfig, in-cluster tokens and TLS work as everywhere else.

LISTs are paginated (``limit`` + ``continue``): at 150,000 pods one unpaginated LIST is a
response of hundreds of MB for the API server to build and for us to hold. Each page is
decoded into what the caller keeps before the next is read, so only one page of raw
objects is in memory at a time. Given a ``shape`` (a TypedDict of the fields the caller
reads), a page is parsed by msgspec into dicts of just those fields: everything else
(managedFields, most of spec and status) is skipped unparsed, a tenth of the time of
parsing whole objects.
"""

from __future__ import annotations

import builtins
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from app.core.errors import DependencyError
from app.loops import Stop
from app.outages import Dependency

log = logging.getLogger(__name__)
T = TypeVar("T")

GROUP = "nodeledger.io"
VERSION = "v1alpha1"
GENERICNODES = f"/apis/{GROUP}/{VERSION}/genericnodes"
# Dynamic Resource Allocation, GA in 1.34: a pod's GPU devices (docs/gpu-identity.md).
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
# 150,000 pods from kube-apiserver 1.34 on two cores: 19 s in pages of 500, 11 s in pages
# of 2,000, 10 s of 5,000 (each page costs the API server a fixed ~40 ms); a page of 2,000
# pods is ~3 MB of JSON.
DEFAULT_PAGE_SIZE = 2000
# A continue token expires with its snapshot (etcd compaction, ~5 min): start over at most
# this many times within one list, then let the caller's retry take over.
LIST_ATTEMPTS = 3
EVENT_MESSAGE_MAX = 1024  # the API server refuses longer Event messages


class KubeError(DependencyError):
    """A Kubernetes API call failed; ``status`` is the API server's answer, None when there
    was none. ``unavailable`` (no answer, or a 5xx) is an outage, not a bug: retryable."""

    code = "kube_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        if status is None or status >= 500:
            self.code = "kube_unavailable"
            self.http_status = 503
            self.retryable = self.unavailable = True


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct, Generic[T]):
    metadata: _ListMeta
    items: list[T] | None = None


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _page_decoder(shape: Any) -> msgspec.json.Decoder[_Page[Any]]:
    decoder = _decoders.get(shape)
    if decoder is None:
        decoder = _decoders[shape] = msgspec.json.Decoder(_Page[shape])
    return decoder


class _ContinueExpired(Exception):
    """The snapshot a continue token points into is gone (HTTP 410)."""


class KubeClient:
    def __init__(
        self,
        kubeconfig: Path | None,
        *,
        timeout: float = 10.0,
        page_size: int = DEFAULT_PAGE_SIZE,
        availability: Dependency | None = None,
    ) -> None:
        # An outage of the API server logged once, not at every call (app.outages).
        self.availability = availability or Dependency("kubernetes")
        if kubeconfig is not None:
            self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        else:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            self.api_client = client.ApiClient(configuration)
        self.timeout = timeout
        self.page_size = page_size

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        response = self._call(method, path, query, body, content_type, timeout or self.timeout)
        data = response.data
        return json.loads(data) if data else {}

    def list(
        self,
        path: str,
        decode: Callable[[dict[str, Any]], T],
        shape: Any = None,
        **query: Any,
    ) -> tuple[builtins.list[T], str]:
        """Every object (each passed through ``decode``) and the list's resourceVersion,
        read in pages of ``page_size``; with ``shape``, ``decode`` gets only its fields.

        The pages of one list are one consistent snapshot: every page carries the same
        resourceVersion, which is the one to watch from. A continue token that expired
        (410) means starting again from the first page; anything decoded so far is dropped,
        so nothing is returned twice or from two snapshots.
        """
        for attempt in range(1, LIST_ATTEMPTS + 1):
            try:
                return self._list_pages(path, decode, shape, query)
            except _ContinueExpired as exc:
                log.info("%s: list continue token expired (%s), listing again", path, exc)
                if attempt == LIST_ATTEMPTS:
                    raise KubeError(f"GET {path}: {exc}", 410) from exc
        raise AssertionError("unreachable")

    def _list_pages(
        self,
        path: str,
        decode: Callable[[dict[str, Any]], T],
        shape: Any,
        query: dict[str, Any],
    ) -> tuple[builtins.list[T], str]:
        items: builtins.list[T] = []
        version: str | None = None
        # The next page is fetched while this one is decoded: the API server's time per
        # page and ours overlap (150,000 pods: 12 s -> 8 s here).
        with ThreadPoolExecutor(1, thread_name_prefix="list-page") as fetcher:
            params = {**query, "limit": str(self.page_size)}
            page = fetcher.submit(self._page, path, params, shape)
            while True:
                try:
                    objects, meta = page.result()
                except KubeError as exc:
                    if "continue" in params and exc.status == 410:
                        raise _ContinueExpired(str(exc)) from exc
                    raise
                version = version or meta.resourceVersion  # the same on every page
                if meta.continue_:
                    params = {**query, "limit": str(self.page_size), "continue": meta.continue_}
                    page = fetcher.submit(self._page, path, params, shape)
                items.extend(decode(obj) for obj in objects)
                if not meta.continue_:
                    return items, version

    def _page(
        self, path: str, params: dict[str, Any], shape: Any
    ) -> tuple[builtins.list[dict[str, Any]], _ListMeta]:
        response = self._call("GET", path, params, None, "application/json", self.timeout)
        try:
            if shape is not None:
                page = _page_decoder(shape).decode(response.data)
                return page.items or [], page.metadata
            body = json.loads(response.data)
            meta = body.get("metadata") or {}
            list_meta = _ListMeta(str(meta["resourceVersion"]), meta.get("continue") or "")
            return body.get("items") or [], list_meta
        except (msgspec.MsgspecError, ValueError, KeyError) as exc:
            raise KubeError(f"GET {path}: unreadable list page: {exc}") from exc

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout: int,
        *,
        stop: Stop | None = None,
        **query: Any,
    ) -> Iterator[dict[str, Any]]:
        """The watch's events until the API server ends it (after ``timeout`` seconds) or
        ``stop`` is set. Setting ``stop`` shuts the stream's socket for reading, which ends
        a read blocked on it at once (kopf closes its stream from a done-callback the same
        way); the events then just end."""
        params = {
            **query,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        response = self._call("GET", path, params, None, "application/json", timeout + 10)
        with _Stream(response, stop) as stream:
            try:
                for line in iter_resp_lines(response):
                    if line:
                        yield json.loads(line)
            except Exception:
                if not stream.stopped:  # else the broken read is the shutdown's
                    raise
            stream.ended = not stream.stopped

    def bind(self, namespace: str, pod: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", body=body)

    def pod_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, at: datetime
    ) -> None:
        """A Warning Event on the pod (core/v1, as `kubectl describe pod` shows it)."""
        stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:EVENT_MESSAGE_MAX],
            "type": "Warning",
            "source": {"component": "nodeledger"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }  # fmt: skip
        self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)

    def resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """A ResourceClaim (resource.k8s.io/v1) as the API server has it."""
        return self.request("GET", f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}")

    def resource_slices(self, node: str, drivers: Collection[str]) -> builtins.list[dict[str, Any]]:
        """The ResourceSlices of ``node`` (field selector ``spec.nodeName``) published by one
        of ``drivers``."""
        slices, _ = self.list(
            f"{RESOURCE_V1}/resourceslices",
            lambda item: item,
            fieldSelector=f"spec.nodeName={node}",
        )
        return [s for s in slices if (s.get("spec") or {}).get("driver") in drivers]

    def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.request(
            "PATCH",
            f"{path}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: float,
    ) -> Any:
        """The raw urllib3 response (not yet read) of a successful call."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method, url, headers, body, post = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(
                method, url, header_params=headers, body=body, post_params=post,
                _request_timeout=timeout,
            ).response  # fmt: skip
        except ApiException as exc:
            self._answered(exc.status, f"{method} {path}: {exc.status}")
            raise KubeError(
                f"{method} {path}: {exc.status} {_reason(exc.body, exc.reason)}", exc.status
            ) from exc
        except Exception as exc:  # urllib3 connection errors and timeouts
            self.availability.failed(f"{method} {path}: {exc}")
            raise KubeError(f"{method} {path}: {exc}") from exc
        self._answered(response.status, f"{method} {path}: {response.status}")
        if not 200 <= response.status <= 299:
            data = response.data
            raise KubeError(
                f"{method} {path}: {response.status} {_reason(data, response.reason)}",
                response.status,
            )
        return response

    def _answered(self, status: int | None, what: str) -> None:
        # 5xx: the API server (or what is in front of it) is not serving; else it answered.
        if status is not None and status >= 500:
            self.availability.failed(what)
        else:
            self.availability.answered()


class _Stream:
    """A watch's response while it is read. Setting ``stop`` shuts its socket, under a lock
    that keeps the shutdown off a response already closed or given back to the pool (whose
    connection may serve another request by then). A stream read to its end (``ended``)
    gives the connection back to the pool; a stopped or broken one closes it."""

    def __init__(self, response: Any, stop: Stop | None) -> None:
        self.response = response
        self.stop = stop
        self.stopped = False
        self.ended = False
        self._lock = threading.Lock()
        self._done = False
        self._unregister: Callable[[], None] | None = None

    def __enter__(self) -> _Stream:
        if self.stop is not None:
            self._unregister = self.stop.on_set(self._shut)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unregister is not None:
            self._unregister()
        with self._lock:
            self._done = True
            if self.ended:
                self.response.release_conn()
            else:
                self.response.close()

    def _shut(self) -> None:
        with self._lock:
            if self._done:
                return
            self.stopped = True
            try:
                self.response.shutdown()  # shutdown(SHUT_RD): the blocked read sees the end
            except (OSError, ValueError, RuntimeError) as exc:  # already closed or released
                log.debug("shutting a watch's stream: %s", exc)


def _reason(body: Any, fallback: Any) -> str:
    try:
        return str(json.loads(body or "{}").get("message") or fallback)
    except (TypeError, ValueError):
        return str(fallback)
