"""Static mode: tokens and their permissions from a JSON file, re-read whenever its mtime,
size or inode changes (a mounted Secret is rotated by replacing the file).

    [
      {"user": "ci", "token": "...", "allow": ["create admissions", "delete admissions"]},
      {"user": "ops", "token": "...", "groups": ["ops"], "allow": ["*"]},
      {"user": "system:serviceaccount:nodeledger:nodeledger-scheduler",
       "allow": ["create bindings", "get nodes"]}
    ]

An entry without a token gives permissions to a client certificate whose CN is its user.
A permission is "<verb> <resource>", either may be "*"; "*" alone allows everything;
static mode does not restrict by name. A file that cannot be read or parsed refuses every
caller (503) until it is fixed: a revoked token never comes back through a bad edit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from app.auth.errors import AuthUnavailable, Unauthenticated
from app.auth.model import RESOURCES, VERBS, Decision, Identity, Permission

log = logging.getLogger(__name__)
MIN_TOKEN_LENGTH = 16


def _grant(grant: str) -> str:
    """A permission as the file writes it. Words are separated by ASCII spaces only: a tab
    or a no-break space once made a grant that validated and granted nothing."""
    words = [w for w in grant.split(" ") if w]
    if any(not w.isprintable() or not w.isascii() for w in words) or not words:
        raise ValueError(
            "a permission's words are separated by spaces: no tab, line break, no-break "
            "or other white space, no character outside ASCII"
        )
    if words != ["*"] and (
        len(words) != 2 or words[0] not in {*VERBS, "*"} or words[1] not in {*RESOURCES, "*"}
    ):
        raise ValueError(
            f'a permission is "<verb> <resource>" or "*", verb one of '
            f"{', '.join(sorted(VERBS))}, resource one of {', '.join(sorted(RESOURCES))}"
            ' (or "*")'
        )
    return " ".join(words)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(min_length=1)
    token: str | None = Field(default=None, min_length=MIN_TOKEN_LENGTH)
    uid: str = ""
    groups: tuple[str, ...] = ()
    allow: tuple[Annotated[str, AfterValidator(_grant)], ...] = ()


# The keys a file may have: any other key is named by position only (it may be a token).
_KEYS = frozenset(_Entry.model_fields)


_FILE = TypeAdapter(list[_Entry])


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class _Table:
    identities: dict[bytes, Identity]  # sha256(token) -> identity
    grants: dict[str, frozenset[tuple[str, str]]]  # user -> {(verb, resource)}


def _parse(text: str, path: Path) -> _Table:
    """The file's table; ValueError naming the place, never the content (it is secret)."""
    try:
        entries = _FILE.validate_python(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno})") from None
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False, include_context=False)
        where = "; ".join(_described(e["loc"], e["msg"]) for e in errors)
        raise ValueError(f"{path}: {where}") from None
    identities: dict[bytes, Identity] = {}
    grants: dict[str, set[tuple[str, str]]] = {}
    for index, entry in enumerate(entries):
        if entry.token is not None:
            digest = _digest(entry.token)
            if digest in identities:
                raise ValueError(f"{path}: {index}.token: the same token is listed twice")
            identities[digest] = Identity.of(entry.user, entry.groups, entry.uid)
        mine = grants.setdefault(entry.user, set())
        for grant in entry.allow:  # normalized by _grant: "*" or "verb resource"
            verb, _, resource = grant.partition(" ")
            mine.add((verb, resource or "*"))
    return _Table(identities, {user: frozenset(g) for user, g in grants.items()})


def _described(loc: tuple[Any, ...], message: str) -> str:
    """An error's place and reason, naming keys only when they are the file's own: a key
    that is not (a token written as a key) stays unsaid, as do all values."""
    if len(loc) >= 2 and isinstance(loc[0], int) and loc[1] not in _KEYS:
        return f"{loc[0]}: an unknown key (not shown: it may be a secret); the keys are " + (
            ", ".join(sorted(_KEYS))
        )
    shown = [str(p) if isinstance(p, int) or p in _KEYS else "?" for p in loc]
    return f"{'.'.join(shown)}: {message}"


class StaticTokens:
    """Authenticator and Authorizer of static mode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self._table: _Table | None = None
        self._error: str | None = None
        try:
            self._load()
        except AuthUnavailable:
            raise ValueError(self._error) from None

    def _load(self) -> _Table:
        """The current table; one stat per call, a parse only when the file changed."""
        try:
            st = self.path.stat()
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            if key != self._key:
                self._key = key
                self._table, self._error = _parse(self.path.read_text(), self.path), None
                log.info("static tokens loaded from %s", self.path)
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError):
                self._key = None  # read again next time
                message = f"{self.path}: {exc.strerror}"
            else:
                message = str(exc)
            if message != self._error:
                log.error("static token file unusable, refusing every caller: %s", message)
            self._table, self._error = None, message
        if self._table is None:
            raise AuthUnavailable(f"the static token file is unusable: {self._error}")
        return self._table

    async def authenticate(self, token: str) -> Identity:
        identity = self._load().identities.get(_digest(token))
        if identity is None:
            raise Unauthenticated("the bearer token is not valid")
        return identity

    async def authorize(self, identity: Identity, permission: Permission) -> Decision:
        grants = self._load().grants.get(identity.user, frozenset())
        for verb, resource in grants:
            if verb in ("*", permission.verb) and resource in ("*", permission.resource):
                return Decision(True)
        return Decision(False, f'no entry for user "{identity.user}" in the token file allows it')
