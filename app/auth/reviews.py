"""Kubernetes mode, as kube-rbac-proxy does it: a bearer token is authenticated with a
TokenReview (authentication.k8s.io/v1), a caller is authorized with a SubjectAccessReview
(authorization.k8s.io/v1) for a resource attribute of the nodeledger.io group.

Both answers, yes and no, are reused for ``ttl`` seconds (bounded caches): a revoked token
or permission stops working within that time. A review that cannot be made (API server
unreachable, slow, or refusing nodeledger) answers 503 and is not cached: fail closed.
The API calls sit behind ``Reviews`` so tests use a fake; they are blocking and run in a
worker thread, the caches are read on the event loop.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import MutableMapping
from typing import Any, Protocol

from fastapi.concurrency import run_in_threadpool

from app.auth.errors import AuthUnavailable, Unauthenticated
from app.auth.model import GROUP, Decision, Identity, Permission
from app.core.errors import DependencyError

log = logging.getLogger(__name__)


class ReviewError(DependencyError):
    """A review failed (no answer, or an error status); the message holds no credential.
    ``unavailable``: the API server is not answering, an outage its client logs once
    (app.outages): each request's failure is then only a DEBUG line. It reaches no route:
    the reviewers answer it as AuthUnavailable."""

    code = "review_failed"

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        if unavailable:
            self.http_status = 503
            self.retryable = self.unavailable = True


class Reviews(Protocol):
    def token_review(self, token: str) -> dict[str, Any]:
        """The TokenReview's status; ReviewError when there is none."""
        ...

    def access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The SubjectAccessReview's status; ReviewError when there is none."""
        ...


def redact(text: str, secret: str) -> str:
    return text.replace(secret, "[redacted]") if secret else text


def _unavailable(what: str, error: ReviewError) -> AuthUnavailable:
    reason = f"the review by the Kubernetes API server failed ({error})"
    return AuthUnavailable(f"cannot {what}: {reason}")


class TokenReviewer:
    """Authenticator: bearer token -> Kubernetes user."""

    def __init__(self, reviews: Reviews, cache: MutableMapping[bytes, Identity | str]) -> None:
        self.reviews = reviews
        # sha256(token) -> the identity, or the reason it was not accepted
        self.cache = cache

    async def authenticate(self, token: str) -> Identity:
        key = hashlib.sha256(token.encode()).digest()
        cached = self.cache.get(key)
        if cached is None:
            try:
                status = await run_in_threadpool(self.reviews.token_review, token)
            except ReviewError as exc:
                level = logging.DEBUG if exc.unavailable else logging.WARNING
                log.log(level, "TokenReview failed: %s", exc)
                raise _unavailable("check the bearer token", exc) from None
            cached = self._outcome(status, token)
            self.cache[key] = cached
        if isinstance(cached, str):
            raise Unauthenticated(cached)
        return cached

    @staticmethod
    def _outcome(status: dict[str, Any], token: str) -> Identity | str:
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            error = redact(str(status.get("error") or "not authenticated"), token)
            log.info("a bearer token was not accepted: %s", error)
            return "the bearer token is not valid (expired, revoked or not for this cluster)"
        return Identity.of(
            str(user["username"]),
            [str(g) for g in user.get("groups") or ()],
            str(user.get("uid") or ""),
            {str(k): [str(x) for x in v or ()] for k, v in (user.get("extra") or {}).items()},
        )


class AccessReviewer:
    """Authorizer: (identity, permission) -> SubjectAccessReview's answer."""

    def __init__(
        self, reviews: Reviews, cache: MutableMapping[tuple[Identity, Permission], Decision]
    ) -> None:
        self.reviews = reviews
        self.cache = cache

    async def authorize(self, identity: Identity, permission: Permission) -> Decision:
        key = (identity, permission)
        decision = self.cache.get(key)
        if decision is None:
            spec = _spec(identity, permission)
            try:
                status = await run_in_threadpool(self.reviews.access_review, spec)
            except ReviewError as exc:
                level = logging.DEBUG if exc.unavailable else logging.WARNING
                log.log(level, "SubjectAccessReview failed: %s", exc)
                what = f'check whether user "{identity.user}" may {permission}'
                raise _unavailable(what, exc) from None
            allowed = bool(status.get("allowed")) and not status.get("denied")
            reason = str(status.get("reason") or status.get("evaluationError") or "")
            decision = Decision(allowed, reason)
            self.cache[key] = decision
        return decision


def _spec(identity: Identity, permission: Permission) -> dict[str, Any]:
    attributes = {"group": GROUP, "resource": permission.resource, "verb": permission.verb}
    if permission.name:
        attributes["name"] = permission.name
    spec: dict[str, Any] = {"user": identity.user, "resourceAttributes": attributes}
    if identity.groups:
        spec["groups"] = list(identity.groups)
    if identity.uid:
        spec["uid"] = identity.uid
    if identity.extra:
        spec["extra"] = {k: list(v) for k, v in identity.extra}
    return spec
