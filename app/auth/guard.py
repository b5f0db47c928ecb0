"""The FastAPI side: one Guard per application (app.state.auth), route dependencies that
name the permission a route needs, and the 401/403/503 refusals (app.auth.errors,
answered by the API's one error handler, app.api.errors).

    @router.put("/nodes/{name}", dependencies=[require("update", "nodes", name=path("name"))])

The caller is the bearer token of the Authorization header when there is one, else the
TLS client certificate of the connection (app.auth.tls). The identity is left on
``request.state.identity`` for whoever wants to record an actor.

The OpenAPI document lists 401, 403 and 503 on exactly the routes that carry one of these
dependencies (on the route or its router), so no guarded route can be left undocumented
(``document_refusals``, which app.api.errors calls with the error shape's schema).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from weakref import WeakKeyDictionary

from fastapi import Depends, FastAPI, Request, routing
from fastapi.dependencies.models import Dependant

from app.auth.errors import CHALLENGE, Forbidden, Unauthenticated
from app.auth.model import Authenticator, Authorizer, Identity, Permission
from app.auth.tls import client_identity

log = logging.getLogger(__name__)
# What a guarded route may answer besides its own responses (the OpenAPI document).
REFUSALS = {
    "401": "No credential, or one not accepted",
    "403": "The caller lacks the permission",
    "503": "The credential cannot be checked now",
}
READ_NOTE = " (reads: only with NODELEDGER_AUTH_PROTECT_READS)"
CHALLENGE_HEADER = {"description": CHALLENGE["WWW-Authenticate"], "schema": {"type": "string"}}
NameOf = Callable[[Request], Awaitable[str | None]]
# Every guard dependency made by require()/require_read(): True for a read.
_GUARDS: WeakKeyDictionary[Callable[..., Any], bool] = WeakKeyDictionary()


class Guard:
    """Authenticates and authorizes a request; ``Guard()`` lets everyone in (mode none)."""

    def __init__(
        self,
        authenticator: Authenticator | None = None,
        authorizer: Authorizer | None = None,
        *,
        protect_reads: bool = False,
    ) -> None:
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.protect_reads = protect_reads

    @property
    def enabled(self) -> bool:
        return self.authenticator is not None and self.authorizer is not None

    async def check(self, request: Request, permission: Permission) -> Identity:
        if self.authenticator is None or self.authorizer is None:
            raise RuntimeError("Guard.check without an authenticator")
        identity = await self._identify(request)
        decision = await self.authorizer.authorize(identity, permission)
        if not decision.allowed:
            log.info('denied: user "%s" may not %s', identity.user, permission)
            why = f": {decision.reason}" if decision.reason else ""
            raise Forbidden(f'user "{identity.user}" may not {permission}{why}')
        request.state.identity = identity
        return identity

    async def _identify(self, request: Request) -> Identity:
        assert self.authenticator is not None
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
            return await self.authenticator.authenticate(token)
        identity = client_identity(request.scope)
        if identity is None:
            raise Unauthenticated(
                "authentication required: send 'Authorization: Bearer <token>' "
                "(or connect with a client certificate the service trusts)"
            )
        return identity


def path(key: str) -> NameOf:
    """The permission's name is this path parameter (a node name, a holder uid)."""

    async def name(request: Request) -> str | None:
        value = request.path_params.get(key)
        return str(value) if value is not None else None

    return name


def body(key: str) -> NameOf:
    """The permission's name is this string field of the JSON body (None when absent:
    the route answers 422 for such a body anyway)."""

    async def name(request: Request) -> str | None:
        try:
            document = await request.json()
        except ValueError:
            return None
        value = document.get(key) if isinstance(document, dict) else None
        return value if isinstance(value, str) else None

    return name


def _dependency(verb: str, resource: str, name: NameOf | None, *, read: bool) -> Any:
    async def guard(request: Request) -> Identity | None:
        auth: Guard = request.app.state.auth
        if not auth.enabled or (read and not auth.protect_reads):
            return None
        named = await name(request) if name is not None else None
        return await auth.check(request, Permission(verb, resource, named))

    _GUARDS[guard] = read
    return Depends(guard)


def require(verb: str, resource: str, *, name: NameOf | None = None) -> Any:
    """Dependency of a write: the caller needs ``verb`` on ``resource`` (.nodeledger.io)."""
    return _dependency(verb, resource, name, read=False)


def require_read(verb: str, resource: str, *, name: NameOf | None = None) -> Any:
    """Dependency of a read: open unless NODELEDGER_AUTH_PROTECT_READS."""
    return _dependency(verb, resource, name, read=True)


def _guards(dependant: Dependant) -> list[bool]:
    """The guards among a route's dependencies, nested ones included: True for a read."""
    found = []
    for sub in dependant.dependencies:
        if sub.call is not None and sub.call in _GUARDS:
            found.append(_GUARDS[sub.call])
        found += _guards(sub)
    return found


def _routes(app: FastAPI) -> list[Any]:
    """The app's routes with their effective dependencies (the router's included): FastAPI
    0.16x keeps included routers unflattened and resolves them in iter_route_contexts."""
    iterate = getattr(routing, "iter_route_contexts", None)
    return list(iterate(app.routes)) if iterate is not None else list(app.routes)


def document_refusals(
    app: FastAPI, document: dict[str, Any], content: dict[str, Any]
) -> dict[str, Any]:
    """Add 401/403/503, answered with ``content`` (the error shape), to every guarded
    operation of the OpenAPI document; idempotent."""
    for route in _routes(app):
        dependant = getattr(route, "dependant", None)
        reads = _guards(dependant) if isinstance(dependant, Dependant) else []
        if not reads:
            continue
        note = READ_NOTE if all(reads) else ""
        operations = document.get("paths", {}).get(route.path_format, {})
        for method in route.methods:
            operation = operations.get(method.lower())
            if operation is None:  # not in the document (include_in_schema=False)
                continue
            for status, what in REFUSALS.items():
                answer: dict[str, Any] = {"description": what + note, "content": content}
                if status == "401":
                    answer["headers"] = {"WWW-Authenticate": CHALLENGE_HEADER}
                operation["responses"].setdefault(status, answer)
    return document


def install(app: FastAPI, guard: Guard) -> None:
    """Put the guard on the app (its refusals are answered and documented by app.api.errors)."""
    app.state.auth = guard
