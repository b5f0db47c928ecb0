"""OpenAPI links: which call may follow an answer, and the values it takes from it.

They document the workflow (register a node, admit on it, release what was admitted, look
at the node) and let a stateful client, such as the schemathesis run in tests/fuzz, chain
calls on real names instead of guessing them. Targets are operationRefs (JSON pointers
into this document), so renaming a handler cannot break them.
"""

from __future__ import annotations

from typing import Any


def operation_ref(method: str, path: str) -> str:
    pointer = path.replace("~", "~0").replace("/", "~1")
    return f"#/paths/{pointer}/{method.lower()}"


def link(method: str, path: str, description: str, **parameters: str) -> dict[str, Any]:
    return {
        "operationRef": operation_ref(method, path),
        "description": description,
        "parameters": parameters,
    }


_NODE_NAME = "$response.body#/name"  # of a NodeOut
NODE = {
    "GetNode": link("GET", "/v1/nodes/{name}", "The node", name=_NODE_NAME),
    "DeleteNode": link("DELETE", "/v1/nodes/{name}", "Remove the node", name=_NODE_NAME),
    "NodeHoldings": link("GET", "/v1/holdings", "What the node holds", node=_NODE_NAME),
    "NodeEvents": link("GET", "/v1/events", "The node's history", node=_NODE_NAME),
}

_HOLDING_NODE = "$response.body#/node"  # of a HoldingOut
HOLDING = {
    "Release": link(
        "DELETE",
        "/v1/admissions/{holder_uid}",
        "Release the holding",
        holder_uid="$response.body#/holder/id",
        kind="$response.body#/holder/kind",
    ),
    "GetNode": link("GET", "/v1/nodes/{name}", "The node it holds on", name=_HOLDING_NODE),
}

RELEASED = {
    "GetNode": link("GET", "/v1/nodes/{name}", "The node it held on", name=_HOLDING_NODE),
}
