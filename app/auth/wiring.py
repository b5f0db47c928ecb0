"""Builds the Guard the settings ask for."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cachetools import TTLCache

from app.auth.guard import Guard
from app.auth.reviews import AccessReviewer, KubeReviews, Reviews, TokenReviewer
from app.auth.static import StaticTokens
from app.kube.client import KubeClient

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger(__name__)


def build_guard(settings: Settings, *, reviews: Reviews | None = None) -> Guard:
    """``reviews``: the TokenReview/SubjectAccessReview calls (default: through a KubeClient
    of NODELEDGER_KUBE_KUBECONFIG, in-cluster when unset)."""
    auth = settings.auth
    reads = "reads need a caller too" if auth.protect_reads else "reads are open"
    if auth.mode == "none":
        log.warning("NODELEDGER_AUTH_MODE=none: anyone who reaches the API may change the ledger")
        return Guard()
    if auth.mode == "static":
        assert auth.token_file is not None  # AuthSettings checks it
        tokens = StaticTokens(auth.token_file)
        log.info("authentication: static tokens from %s; %s", auth.token_file, reads)
        return Guard(tokens, tokens, protect_reads=auth.protect_reads)
    if reviews is None:
        reviews = KubeReviews(KubeClient(settings.kube.kubeconfig, timeout=auth.review_timeout))
    log.info("authentication: Kubernetes TokenReview and SubjectAccessReview; %s", reads)
    return Guard(
        # Bounded, expiring; used from the event loop only, so no lock.
        TokenReviewer(reviews, TTLCache(maxsize=auth.cache_size, ttl=auth.cache_ttl)),
        AccessReviewer(reviews, TTLCache(maxsize=auth.cache_size, ttl=auth.cache_ttl)),
        protect_reads=auth.protect_reads,
    )
