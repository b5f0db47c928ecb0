"""TokenReview and SubjectAccessReview through the Kubernetes API: the ``Reviews`` the
guard's reviewers call (app.auth.reviews), on the service's own Kubernetes client."""

from __future__ import annotations

from typing import Any

from app.auth.reviews import ReviewError, redact
from app.kube.client import KubeClient, KubeError

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class KubeReviews:
    """The two POSTs through KubeClient (kubeconfig or in-cluster credentials). The
    TokenReview answer echoes the token in its spec: only its status leaves here."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def token_review(self, token: str) -> dict[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            answer = self.client.request("POST", TOKENREVIEWS, body=body)
        except KubeError as exc:
            away = self.client.availability.down
            raise ReviewError(redact(str(exc), token), unavailable=away) from None
        return dict(answer.get("status") or {})

    def access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        try:
            answer = self.client.request("POST", SUBJECTACCESSREVIEWS, body=body)
        except KubeError as exc:
            raise ReviewError(str(exc), unavailable=self.client.availability.down) from None
        return dict(answer.get("status") or {})
