"""The FastAPI side: one Guard per application (app.state.auth), route dependencies that
name the permission a route needs, and the 401/403/503 answers.

    @router.put("/nodes/{name}", dependencies=[require("update", "nodes", name=path("name"))])

The caller is the bearer token of the Authorization header when there is one, else the
TLS client certificate of the connection (app.auth.tls). The identity is left on
``request.state.identity`` for whoever wants to record an actor.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from app.api.schemas import ErrorOut
from app.auth.errors import AuthError, Forbidden, Unauthenticated
from app.auth.model import Authenticator, Authorizer, Identity, Permission
from app.auth.tls import client_identity

log = logging.getLogger(__name__)
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="nodeledger"'}
# For the OpenAPI document of guarded routes.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "No credential, or one not accepted"},
    403: {"model": ErrorOut, "description": "The caller lacks the permission"},
    503: {"model": ErrorOut, "description": "The credential cannot be checked now"},
}
NameOf = Callable[[Request], Awaitable[str | None]]


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

    return Depends(guard)


def require(verb: str, resource: str, *, name: NameOf | None = None) -> Any:
    """Dependency of a write: the caller needs ``verb`` on ``resource`` (.nodeledger.io)."""
    return _dependency(verb, resource, name, read=False)


def require_read(verb: str, resource: str, *, name: NameOf | None = None) -> Any:
    """Dependency of a read: open unless NODELEDGER_AUTH_PROTECT_READS."""
    return _dependency(verb, resource, name, read=True)


def install(app: FastAPI, guard: Guard) -> None:
    """Put the guard on the app and answer AuthErrors in the API's error shape."""
    app.state.auth = guard

    @app.exception_handler(AuthError)
    async def _auth_error(_request: Request, exc: AuthError) -> JSONResponse:
        answer = ErrorOut(detail=exc.message, code=exc.code, retryable=exc.retryable)
        headers = CHALLENGE if isinstance(exc, Unauthenticated) else None
        return JSONResponse(answer.model_dump(), status_code=exc.status, headers=headers)
