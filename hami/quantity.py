"""Kubernetes resource quantities ("16Gi", "500m", "1.5e3") as exact numbers.

Mirrors k8s.io/apimachinery/pkg/api/resource: binary suffixes (Ki..Ei), decimal suffixes
(n, u, m, k, M, G, T, P, E) and decimal exponents. Fractions keep "0.5Gi" exact.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")
MIB = Fraction(2**20)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message says what was expected."""


def parse_quantity(value: object) -> Fraction:
    # The same few strings ("8Gi", "1", "500m") arrive in every pod: remember their parses.
    if type(value) is str and len(value) <= 64:
        return _parse_text(value)
    return _parse_any(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    return _parse_any(value)


def _parse_any(value: object) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if abs(value) > 2**63:
            raise QuantityError(f"{value} is out of range for a quantity")
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):  # NaN or infinite (JSON "Infinity")
            raise QuantityError(f"{value!r} is not a finite quantity")
        return Fraction(value).limit_denominator(10**9)
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity (expected a string such as '8Gi' or '2')")
    match = _QUANTITY.match(value.strip())
    if not match:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. '8Gi', '500m', '2')")
    number, exponent, suffix = match.groups()
    # Bounds far beyond any real quantity (Kubernetes keeps them in int64) keep a hostile value
    # ("1e999999999", a 10,000-digit number) from costing seconds of CPU on the request path.
    if len(number) > 40 or (exponent and abs(int(exponent[1:])) > 40):
        raise QuantityError(f"{value[:50]!r} is out of range for a quantity")
    amount = Fraction(number)
    if exponent:
        amount *= Fraction(10) ** int(exponent[1:])
    return amount * _SUFFIX[suffix or ""]


def to_int_ceil(value: Fraction) -> int:
    """Round up, as the API server does for integer-only resources (GPU counts, MiB)."""
    return -((-value.numerator) // value.denominator)


def bytes_to_mib(value: Fraction) -> int:
    return to_int_ceil(value / MIB)


def format_mib(mib: float) -> str:
    """Human form for messages: 8192 -> '8Gi', 3174 -> '3.1Gi', 512 -> '512Mi'."""
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:.0f}Gi" if gib == int(gib) else f"{gib:.1f}Gi"
    return f"{mib:.0f}Mi"
