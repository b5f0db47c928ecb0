"""Keyset pages of nodes and holdings: where a page ends, and in which order.

A page never carries an offset. It ends at a key (the last row's sort columns) and the
next page starts strictly after that key, so a listing costs the same at any depth, and a
row that exists throughout a walk is seen exactly once however many rows are added or
removed around it. Sorted by free amount, a node whose free amount changes between two
pages moves within the order: it may be seen twice or not at all (sort by name for a
complete walk).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from app.core.records import HolderKind

T = TypeVar("T")
K = TypeVar("K")


class NodeSort(StrEnum):
    """NAME: ascending by name. FREE_*: most free first (capacity - reserved - held), ties
    by name."""

    NAME = "name"
    FREE_CPU = "free_cpu"
    FREE_MEMORY = "free_memory"


@dataclass(frozen=True, slots=True)
class NodeKey:
    """The last node of a page: its name and, when sorted by a free amount, that amount
    (millicores or bytes) as it was when the page was read."""

    name: str
    free: int | None = None


@dataclass(frozen=True, slots=True)
class HoldingKey:
    """The last holding of a page, in the listing's order (node, holder kind, holder id)."""

    node: str
    holder_kind: HolderKind
    holder_id: str


@dataclass(frozen=True, slots=True)
class Page(Generic[T, K]):
    """Up to ``limit`` items; ``next`` is where the following page starts, None at the end."""

    items: tuple[T, ...]
    next: K | None
