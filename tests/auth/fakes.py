"""Fakes of the API server's reviews and helpers shared by the auth tests."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from app.auth.reviews import ReviewError

WRITER_TOKEN = "writer-token-7c1f9e2a5b8d4c3e"
READER_TOKEN = "reader-token-3b6a0d9f1e7c2a58"
STRANGER_TOKEN = "stranger-token-9e4d2c7b1a6f8035"
ALL_TOKENS = (WRITER_TOKEN, READER_TOKEN, STRANGER_TOKEN)

NODE = {"capacity": {"cpu": "8", "memory": "16Gi"}}


def admission(node: str = "n1", uid: str = "u1") -> dict[str, Any]:
    return {
        "node": node,
        "holder": {"kind": "pod", "namespace": "ns", "name": f"p-{uid}", "uid": uid},
        "requests": {"cpu": "1", "memory": "1Gi"},
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class FakeReviews:
    """TokenReview and SubjectAccessReview as the API server answers them. Refusals carry
    the token in their error, the way a careless server might, to prove it is redacted."""

    def __init__(self) -> None:
        self.users = {
            WRITER_TOKEN: "system:serviceaccount:ci:writer",
            READER_TOKEN: "system:serviceaccount:ci:reader",
        }
        # (user, verb, resource, name or None = any)
        self.grants: set[tuple[str, str, str, str | None]] = {
            ("system:serviceaccount:ci:writer", "create", "admissions", None),
            ("system:serviceaccount:ci:writer", "update", "nodes", None),
            ("system:serviceaccount:ci:writer", "delete", "admissions", None),
            ("system:serviceaccount:ci:writer", "delete", "nodes", "n1"),
            ("system:serviceaccount:ci:reader", "list", "nodes", None),
        }
        self.calls: Counter[str] = Counter()
        self.specs: list[dict[str, Any]] = []
        self.down = False

    def token_review(self, token: str) -> dict[str, Any]:
        self.calls["token"] += 1
        if self.down:
            raise ReviewError("POST /apis/authentication.k8s.io/v1/tokenreviews: refused")
        user = self.users.get(token)
        if user is None:
            return {"authenticated": False, "error": f"invalid bearer token {token}"}
        return {
            "authenticated": True,
            "user": {
                "username": user,
                "uid": f"uid-{user}",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
            },
        }

    def access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.calls["access"] += 1
        self.specs.append(spec)
        if self.down:
            raise ReviewError("POST /apis/authorization.k8s.io/v1/subjectaccessreviews: timeout")
        attrs = spec["resourceAttributes"]
        assert attrs["group"] == "nodeledger.io"
        for user, verb, resource, name in self.grants:
            if (user, verb, resource) == (spec["user"], attrs["verb"], attrs["resource"]) and (
                name is None or name == attrs.get("name")
            ):
                return {"allowed": True, "reason": "RBAC: allowed by ClusterRoleBinding"}
        return {"allowed": False}


def write_tokens(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(entries))
    return path


STATIC_ENTRIES: list[dict[str, Any]] = [
    {"user": "ci", "token": WRITER_TOKEN, "allow": ["create admissions", "* nodes"]},
    {"user": "viewer", "token": READER_TOKEN, "groups": ["ops"], "allow": ["list nodes"]},
    {"user": "scheduler", "allow": ["create bindings", "get nodes"]},
]
