"""GRES strings as slurmrestd shows them and as a node update must send them. Pure.

Shown: ``k8scpu:16,k8smemory:64K,gpu:tesla:4(S:0-1)`` (totals scaled by 1024 per K/M/G/T/P
step, socket or index details in parentheses, commas inside them); ``gres_detail`` of a
job uses ``k8scpu(CNT:4)`` and names devices ``gpu:2(IDX:0,2)``; with one type per device
(docs/gpu-identity.md) every type is listed, held or not: ``gpu:g0:0(IDX:),gpu:g1:1(IDX:1)``.
Sent: exactly ``name[:type]:integer`` entries, because a node update replaces the whole
string and Slurm validates nothing in it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_SCALE = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_COUNT = re.compile(r"^(\d+)([KMGTP]?)$")
_CNT = re.compile(r"CNT:(\d+)")
_IDX = re.compile(r"IDX:([0-9,\-]*)")


@dataclass(frozen=True, slots=True)
class GresEntry:
    name: str
    type: str | None
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.type}:{self.count}" if self.type else f"{self.name}:{self.count}"


def split_items(text: str) -> list[str]:
    """Split on the commas that are not inside parentheses."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip() and item.strip() != "(null)"]


def parse_entry(item: str) -> GresEntry:
    head, _, details = item.partition("(")
    parts = head.split(":")
    name, gres_type, count = parts[0], None, None
    if len(parts) >= 2 and (m := _COUNT.match(parts[-1])):
        count = int(m.group(1)) * _SCALE[m.group(2)]
        gres_type = ":".join(parts[1:-1]) or None
    elif len(parts) >= 2:
        gres_type = ":".join(parts[1:])
    if count is None:
        cnt = _CNT.search(details)
        count = int(cnt.group(1)) if cnt else 1
    return GresEntry(name, gres_type, count)


def parse_gres(text: str) -> list[GresEntry]:
    return [parse_entry(item) for item in split_items(text)]


def gres_count(text: str, name: str) -> int:
    """Total count of one GRES name (all types) in a shown string; 0 when absent."""
    return sum(e.count for e in parse_gres(text) if e.name == name)


def gres_indices(text: str, name: str) -> tuple[int, ...]:
    """The device indices (``IDX:0-1,3``) of one GRES name in a job's ``gres_detail``,
    sorted; () when it names none."""
    indices: set[int] = set()
    for item in split_items(text):
        head, _, details = item.partition("(")
        if head.split(":")[0] != name or not (m := _IDX.search(details)):
            continue
        for part in filter(None, m.group(1).split(",")):
            low, _, high = part.partition("-")
            if low.isdigit() and (high.isdigit() or not high):
                indices.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(indices))


def with_counts(current: str, counts: Mapping[str, int]) -> str:
    """The string to send: ``counts`` replace (or add) their untyped entries, every other
    entry is kept with its name, type and unscaled count."""
    kept = [str(e) for e in parse_gres(current) if e.name not in counts]
    return ",".join([*kept, *(f"{name}:{count}" for name, count in counts.items())])
