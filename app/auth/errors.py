"""The three ways a request is refused, mapped to HTTP once (app.auth.guard.install).

Messages are built by this package from names and reasons only: a credential is never
part of one."""

from __future__ import annotations

from typing import ClassVar


class AuthError(Exception):
    status: ClassVar[int] = 401
    code: ClassVar[str] = "unauthenticated"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthenticated(AuthError):
    """No credential, or one that is not accepted: 401 with WWW-Authenticate: Bearer."""


class Forbidden(AuthError):
    """A known caller without the permission the route needs."""

    status = 403
    code = "forbidden"


class AuthUnavailable(AuthError):
    """The credential cannot be checked now (API server unreachable, token file unreadable):
    refused, never allowed; the caller may retry."""

    status = 503
    code = "auth_unavailable"
    retryable = True
