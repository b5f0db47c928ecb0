"""The three ways a request is refused, answered by the API's one error handler
(app.api.errors); ``CHALLENGE`` goes with every 401.

Messages are built by this package from names and reasons only: a credential is never
part of one."""

from __future__ import annotations

from app.core.errors import NodeledgerError

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="nodeledger"'}


class AuthError(NodeledgerError):
    code = "unauthenticated"
    http_status = 401


class Unauthenticated(AuthError):
    """No credential, or one that is not accepted: 401 with WWW-Authenticate: Bearer."""


class Forbidden(AuthError):
    """A known caller without the permission the route needs."""

    code = "forbidden"
    http_status = 403


class AuthUnavailable(AuthError):
    """The credential cannot be checked now (API server unreachable, token file unreadable):
    refused, never allowed; the caller may retry."""

    code = "auth_unavailable"
    http_status = 503
    retryable = True
