"""Who may change the ledger: callers are authenticated (a bearer token, or a TLS client
certificate) and authorized per route (verb, resource, name in the nodeledger.io group)
before a write reaches the ledger.

Two modes besides ``none``: ``static`` (tokens and permissions from a file re-read when it
changes) and ``kubernetes`` (TokenReview and SubjectAccessReview against the API server,
the way kube-rbac-proxy does it). Every failure closes: no credential or a rejected one is
401, a missing permission 403, an API server that cannot answer 503; a token never
reaches a log line, an exception text or a response.
"""
