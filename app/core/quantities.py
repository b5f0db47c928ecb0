"""Kubernetes quantity strings -> integer base units, at the edges of the ledger (the way
back, for people, is app.core.presentation).

Parsing uses the Kubernetes client's own ``parse_quantity``; on top of it we refuse what it
lets through but Kubernetes would not (NaN, infinities, negatives, absurd sizes) and round
in the direction that never oversubscribes a node: a request rounds up, a capacity down.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from enum import Enum
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity as _k8s_parse_quantity

from app.core.errors import NodeledgerError
from app.core.resources import MAX_CPU_MILLIS, MAX_GPUS, MAX_MEMORY_BYTES

# The grammar of resource.Quantity: sign, ASCII digits, optional fraction, then one suffix
# (binary Ki..Ei, decimal n..E, or an exponent). Checked before parse_quantity, which
# would accept Python-only spellings such as "1_000", "Infinity" or other scripts' digits.
_NUMBER = r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
_QUANTITY = re.compile(rf"^[+-]?{_NUMBER}$")
# What a quantity string may be (no sign but +), for the OpenAPI document.
QUANTITY_PATTERN = rf"^\+?{_NUMBER}$"

Quantity = str | int | float

# The client library is untyped; this is its contract.
parse_quantity: Callable[[str], Decimal] = _k8s_parse_quantity


class Rounding(Enum):
    """UP for requests (never hold less than asked), DOWN for capacities (never promise
    more than exists)."""

    UP = ROUND_CEILING
    DOWN = ROUND_FLOOR


class QuantityError(NodeledgerError, ValueError):
    """A quantity that cannot be turned into base units; the message says why. A ValueError
    too: the API's schemas read quantities in pydantic validators, which answer a
    ValueError as invalid input (422 ``invalid_request``), so it reaches no route itself."""

    code = "invalid_quantity"
    http_status = 422


def to_decimal(value: Quantity) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError("must be a quantity, not a boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise QuantityError("must be a finite number")
    text = value if isinstance(value, str) else str(value)
    text = text.strip()
    if not _QUANTITY.match(text):
        raise QuantityError(f"{text!r} is not a quantity (examples: 250m, 2, 4Gi, 1e3)")
    try:
        number = Decimal(parse_quantity(text))
    except (ValueError, InvalidOperation, ArithmeticError) as exc:
        raise QuantityError(f"{text!r} is not a quantity: {exc}") from exc
    if not number.is_finite():
        raise QuantityError(f"{text!r} is not a finite quantity")
    if number < 0:
        raise QuantityError(f"{text!r} is negative")
    if number.adjusted() > 30:  # far past any bound below; keeps Decimal arithmetic exact
        raise QuantityError(f"{text!r} exceeds the maximum supported size")
    return number


def _integral(number: Decimal, rounding: Rounding, limit: int, what: str) -> int:
    # Compare before quantizing: a huge exponent would make quantize() raise.
    if number > limit:
        raise QuantityError(f"{what} {number} exceeds the maximum {limit}")
    return int(number.to_integral_value(rounding=rounding.value))


def _cpu_millis(value: Quantity, rounding: Rounding) -> int:
    return _integral(to_decimal(value) * 1000, rounding, MAX_CPU_MILLIS, "cpu millicores")


def _memory_bytes(value: Quantity, rounding: Rounding) -> int:
    return _integral(to_decimal(value), rounding, MAX_MEMORY_BYTES, "memory bytes")


def _gpu_count(value: Quantity) -> int:
    number = to_decimal(value)
    if number != number.to_integral_value():
        raise QuantityError(f"gpu count must be a whole number, got {number}")
    return _integral(number, Rounding.UP, MAX_GPUS, "gpu count")


# Every admission carries the same few amounts ("250m", "256Mi"): a parse is remembered
# (a fifth of the admission's body validation). Only short plain values: a cached long one
# would keep its text; an error is not remembered and costs what it did.
_CACHE_SIZE = 512
_CACHED_TEXT = 32
_cpu_millis_cached = lru_cache(_CACHE_SIZE, typed=True)(_cpu_millis)
_memory_bytes_cached = lru_cache(_CACHE_SIZE, typed=True)(_memory_bytes)
_gpu_count_cached = lru_cache(_CACHE_SIZE, typed=True)(_gpu_count)


def _cacheable(value: object) -> bool:
    # Exact types: a bool, or any subclass, takes the uncached path.
    if type(value) is str:
        return len(value) <= _CACHED_TEXT
    return type(value) is int or type(value) is float


def cpu_millis(value: Quantity, rounding: Rounding = Rounding.UP) -> int:
    """CPU cores as a quantity ("1500m", "2", 0.5) -> millicores."""
    if _cacheable(value):
        return _cpu_millis_cached(value, rounding)
    return _cpu_millis(value, rounding)


def memory_bytes(value: Quantity, rounding: Rounding = Rounding.UP) -> int:
    """Memory as a quantity ("4Gi", "2G", 1024) -> bytes."""
    if _cacheable(value):
        return _memory_bytes_cached(value, rounding)
    return _memory_bytes(value, rounding)


def gpu_count(value: Quantity) -> int:
    """GPUs are whole devices: a fraction is an error, not something to round."""
    if _cacheable(value):
        return _gpu_count_cached(value)
    return _gpu_count(value)
