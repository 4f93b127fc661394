"""A labelled Prometheus metric's children, looked up once per label values.

prometheus_client's `labels()` validates the values, builds a key and takes a lock on every call:
about 1.5 µs, twice per GPU admission. The children it returns live as long as the metric (the
webhook never removes a label set), so remembering them is exact.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

M = TypeVar("M")


class Children(Generic[M]):
    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child
