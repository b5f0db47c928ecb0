"""A small slurmrestd client: the calls the service makes, typed results, one error tree.

Every call has a timeout. Idempotent calls (reads, node updates, which set absolute values,
and cancels) are retried a bounded number of times with jittered exponential backoff, and
only when slurmrestd did not answer; an answer (even an error) is never retried. A job
allocation is never retried: the lost answer may have been a job. A node update is retried
only when it never left (no connection): one whose answer was lost may still land after a
newer one, so it is the pusher's to handle (``SlurmAnswerLost``, app.slurm.push). The API version
is the newest one the server's OpenAPI document offers among ``SUPPORTED_VERSIONS``.
"""

from __future__ import annotations

import json as jsonlib
import logging
import threading
from typing import Any

import httpx
import msgspec
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from app.core.slurm_models import Listing, SlurmJob, SlurmNode
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import Dependency
from app.slurm import payloads
from app.slurm.errors import (
    SlurmAnswerLost,
    SlurmAuthError,
    SlurmError,
    SlurmErrorDetail,
    SlurmRequestError,
    SlurmUnavailable,
)
from app.slurm.tokens import TokenSource

log = logging.getLogger(__name__)

INVALID_JOB_ID = 2017  # ESLURM_INVALID_JOB_ID
ALREADY_DONE = 2021  # ESLURM_ALREADY_DONE: "Job/step already completing or completed"


def job_gone(exc: SlurmRequestError) -> bool:
    """Slurm refused a request about a job because the job has ended (or it never knew it)."""
    return bool(exc.errors) and all(
        e.error_number in (INVALID_JOB_ID, ALREADY_DONE) for e in exc.errors
    )


Shape = msgspec.json.Decoder[Any]


def _read(response: httpx.Response) -> bytearray:
    """The whole body, in one buffer: ``Response.read()`` holds it twice for a moment (the
    chunks, then their join), 400 MB for a 200 MB listing of 20,000 jobs."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
    return body


class SlurmClient:
    def __init__(
        self,
        url: str,
        tokens: TokenSource,
        *,
        user_name: str = "slurm",
        timeout: float = 5.0,
        retries: int = 2,
        api_version: str | None = None,
        transport: httpx.BaseTransport | None = None,
        metrics: Metrics = NO_METRICS,
        availability: Dependency | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.metrics = metrics
        # An outage logged once, not at every call (app.outages).
        self.availability = availability or Dependency("slurmrestd", metrics=metrics)
        self.tokens = tokens
        self.user_name = user_name
        self.retries = retries
        self._pinned_version = api_version
        self._version: str | None = api_version
        self._version_lock = threading.Lock()
        self._http = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
            transport=transport,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
        )

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ the calls

    @property
    def version(self) -> str:
        if self._version is None:
            with self._version_lock:
                if self._version is None:
                    self._version = self._negotiate()
        return self._version

    def get_nodes(self, update_time: int | None = None) -> Listing[SlurmNode] | None:
        """All nodes; None when nothing changed since ``update_time`` (HTTP 304)."""
        params = {"update_time": str(update_time)} if update_time else None
        try:
            body = self._call("GET", "nodes/", params=params, shape=payloads.NODES)
        except SlurmRequestError as exc:
            # slurmrestd 24.11 answers 500 "Unable to query partitions" when nodes changed
            # since update_time but partitions did not: ask again for everything.
            if not params or not any("partitions" in e.description for e in exc.errors):
                raise
            body = self._call("GET", "nodes/", shape=payloads.NODES)
        if body is None:
            return None
        nodes = tuple(payloads.parse_node(n) for n in body.get("nodes") or [])
        return Listing(nodes, payloads.number(body.get("last_update")))

    def get_node(self, name: str) -> SlurmNode:
        body = self._call("GET", f"node/{name}")
        nodes = (body or {}).get("nodes") or []
        if not nodes:
            raise SlurmRequestError(f"Slurm has no node {name!r}")
        return payloads.parse_node(nodes[0])

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob] | None:
        """All jobs; None when nothing changed since ``update_time``."""
        params = {"update_time": str(update_time)} if update_time else None
        body = self._call("GET", "jobs/", params=params, shape=payloads.JOBS)
        if body is None:
            return None
        jobs = tuple(payloads.parse_job(j) for j in body.get("jobs") or [])
        last_update = payloads.number(body.get("last_update"))
        if params and not jobs and last_update == 0:
            return None  # 24.11 says "unchanged" this way for jobs, not with a 304
        return Listing(jobs, last_update)

    def get_job(self, job_id: str) -> SlurmJob | None:
        """One job (8.9 KB at any cluster size); None when slurmctld has forgotten it
        (purged MinJobAge after it ended)."""
        try:
            body = self._call("GET", f"job/{job_id}")
        except SlurmRequestError as exc:
            if any(e.error_number == INVALID_JOB_ID for e in exc.errors):
                return None
            raise
        jobs = (body or {}).get("jobs") or []
        return payloads.parse_job(jobs[0]) if jobs else None

    def started_at(self) -> int:
        """When slurmctld's statistics began: its start time, unless someone ran
        ``sdiag --reset``. A change means slurmctld restarted (``GET diag/``, 7 KB)."""
        body = self._call("GET", "diag/") or {}
        return payloads.number((body.get("statistics") or {}).get("req_time_start"))

    def plugins(self) -> tuple[str, dict[str, list[str]]]:
        """The Slurm release and slurmctld's NodeFeaturesPlugins and JobSubmitPlugins, when
        slurmrestd can say (``GET conf`` exists from API v0.0.45 on, Slurm 26.05; else {})."""
        plugins: dict[str, list[str]] = {}
        if int(self.version.rsplit(".", 1)[1]) >= 45:
            body = self._call("GET", "conf") or {}
            conf = body.get("slurm_conf") or {}
            for key in ("NodeFeaturesPlugins", "JobSubmitPlugins"):
                listed = conf.get(key) or []
                # A list in v0.0.45; a comma-separated string would be slurm.conf's own form.
                items = listed.split(",") if isinstance(listed, str) else listed
                plugins[key] = [str(p).strip() for p in items if str(p).strip()]
        else:
            body = self._call("GET", "diag/") or {}
        slurm = (body.get("meta") or {}).get("slurm") or {}
        return str(slurm.get("release") or ""), plugins

    def update_node(
        self,
        name: str,
        *,
        gres: str | None = None,
        extra: str | None = None,
        comment: str | None = None,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Raises ``SlurmAnswerLost`` when the update may yet be applied (module docstring).
        A field left None is left as it is; ``comment=""`` clears the node's comment;
        ``state``: DRAIN (with a ``reason``) or RESUME, as ``scontrol update``."""
        fields = (("gres", gres), ("extra", extra), ("comment", comment), ("reason", reason))
        update: dict[str, str | list[str]] = {k: v for k, v in fields if v is not None}
        if state is not None:
            update["state"] = [state]
        self._call("POST", f"node/{name}", json=update, retry_lost=False)

    def allocate_job(self, job: dict[str, Any]) -> str:
        """Allocate one job (``job``: a job description as this API version spells it) and
        return its id. Not retried: after a lost answer the job may exist."""
        body = self._call("POST", "job/allocate", json={"job": job}, retries=0) or {}
        job_id = payloads.number(body.get("job_id"))
        if not job_id:
            raise SlurmRequestError("slurmrestd POST job/allocate: answer names no job")
        return str(job_id)

    def update_job(self, job_id: str, update: dict[str, Any]) -> None:
        """Update one job (``update``: the fields, as this API version spells them)."""
        self._call("POST", f"job/{job_id}", json=update)

    def cancel_job(self, job_id: str) -> None:
        """Cancel a job. One that already ended, or that Slurm does not know, is no error:
        cancelling twice must be harmless (slurmrestd answers 200 for both anyway)."""
        try:
            self._call("DELETE", f"job/{job_id}")
        except SlurmRequestError as exc:
            if not job_gone(exc):
                raise

    # ------------------------------------------------------------------ plumbing

    def _negotiate(self) -> str:
        doc = self._request("GET", "/openapi/v3")
        paths = list((doc or {}).get("paths") or {})
        version = payloads.newest_supported(paths)
        if version is None:
            raise SlurmRequestError(
                f"slurmrestd at {self.url} offers none of {', '.join(payloads.SUPPORTED_VERSIONS)}"
                " (is it started with -s openapi/slurmctld?)"
            )
        log.info("slurmrestd %s: using API %s", self.url, version)
        return version

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any] | None:
        """A call under /slurm/<version>/ (keywords as for _request)."""
        return self._request(method, f"/slurm/{self.version}/{path}", **kwargs)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
        shape: Shape | None = None,
        retries: int | None = None,
        retry_lost: bool = True,
    ) -> dict[str, Any] | None:
        """``shape``: a successful answer is decoded into just its fields (payloads);
        ``retries``: instead of the client's (0 for a call that is not idempotent);
        ``retry_lost``: False retries only a request that never left (no connection)."""

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, SlurmUnavailable) and (
                retry_lost or not isinstance(exc, SlurmAnswerLost)
            )

        retrying = Retrying(
            stop=stop_after_attempt((self.retries if retries is None else retries) + 1),
            wait=wait_random_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception(retryable),
            reraise=True,
        )
        for attempt in retrying:
            with attempt, self.metrics.slurm_request(method, path):  # each attempt
                try:
                    answer = self._once(method, path, params, json, shape)
                except SlurmUnavailable as exc:
                    self.availability.failed(exc.message)
                    raise
                except SlurmError:
                    self.availability.answered()  # it answered, even if to refuse
                    raise
                self.availability.answered()
                return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        json: dict[str, Any] | None,
        shape: Shape | None,
    ) -> dict[str, Any] | None:
        headers = {"X-SLURM-USER-NAME": self.user_name, "X-SLURM-USER-TOKEN": self.tokens.token()}
        what = f"slurmrestd {method} {path}"
        request = self._http.build_request(method, path, params=params, json=json, headers=headers)
        try:
            response = self._http.send(request, stream=True)
            try:
                content = _read(response)
            finally:
                response.close()
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise SlurmUnavailable(f"{what} timed out connecting") from exc
        except httpx.ConnectError as exc:
            raise SlurmUnavailable(f"{what}: slurmrestd unreachable at {self.url}: {exc}") from exc
        except httpx.TimeoutException as exc:  # sent, maybe whole: slurmrestd may act on it
            raise SlurmAnswerLost(f"{what} timed out") from exc
        except httpx.TransportError as exc:
            raise SlurmAnswerLost(f"{what}: no answer from {self.url}: {exc}") from exc
        if response.status_code == 304:
            return None
        if response.status_code == 401:
            raise SlurmAuthError(f"{what}: no token accepted (HTTP 401)", status=401)
        if response.status_code == 511:
            raise SlurmAuthError(f"{what}: token rejected (HTTP 511)", status=511)
        try:
            if not content:
                body: Any = {}
            elif shape is not None and response.is_success:
                body = shape.decode(content)
            else:
                body = jsonlib.loads(content)
        except (ValueError, msgspec.MsgspecError) as exc:
            if response.is_success:
                raise SlurmUnavailable(f"{what}: answer is not JSON of the expected shape") from exc
            body = {}
        details = tuple(
            SlurmErrorDetail(
                payloads.number(e.get("error_number")),
                str(e.get("error") or ""),
                str(e.get("description") or ""),
            )
            for e in payloads.error_details(body)
        )
        if response.is_success:
            return body if isinstance(body, dict) else {}
        if response.status_code == 404 and self._pinned_version is None and "/slurm/" in path:
            self._version = None  # slurmrestd was upgraded: negotiate again next call
        if details:
            raise SlurmRequestError(what, status=response.status_code, errors=details)
        if response.status_code >= 500:
            raise SlurmUnavailable(
                f"{what}: HTTP {response.status_code}", status=response.status_code
            )
        raise SlurmRequestError(f"{what}: HTTP {response.status_code}", status=response.status_code)
