"""Who is calling and what they want to do, as plain values (hashable: they key the
review caches)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

GROUP = "nodeledger.io"
# What the routes ask for (docs/security.md#authentication-and-authorization has the table).
VERBS = frozenset({"get", "list", "create", "update", "delete"})
RESOURCES = frozenset({"nodes", "holdings", "events", "admissions", "bindings", "jobhints"})


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: a Kubernetes user (from a TokenReview), a static token's
    user, or a client certificate's subject (CN = user, O = groups)."""

    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    via: Literal["token", "certificate"] = "token"

    @classmethod
    def of(
        cls,
        user: str,
        groups: Sequence[str] = (),
        uid: str = "",
        extra: Mapping[str, Sequence[str]] | None = None,
        via: Literal["token", "certificate"] = "token",
    ) -> Identity:
        pairs = tuple(sorted((k, tuple(v)) for k, v in (extra or {}).items()))
        return cls(user, tuple(groups), uid, pairs, via)


@dataclass(frozen=True, slots=True)
class Permission:
    """A resource attribute of the nodeledger.io API group: what a route needs."""

    verb: str
    resource: str
    name: str | None = None

    def __str__(self) -> str:
        named = f' "{self.name}"' if self.name else ""
        return f"{self.verb} {self.resource}.{GROUP}{named}"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Identity:
        """The token's identity; Unauthenticated or AuthUnavailable otherwise."""
        ...


class Authorizer(Protocol):
    async def authorize(self, identity: Identity, permission: Permission) -> Decision:
        """Whether the identity holds the permission; AuthUnavailable when that cannot be
        known now."""
        ...
