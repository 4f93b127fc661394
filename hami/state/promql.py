"""GPU utilisation per device from Prometheus: one instant query for the whole cluster.

prometheus-api-client is synchronous (requests); it runs in a worker thread so the event loop,
which serves admissions, never blocks on it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from hami.state.settings import PrometheusSettings


class PromError(Exception):
    """The utilisation query failed (unreachable, timeout, bad answer)."""


def utilisation_by_uuid(result: Sequence[Mapping[str, Any]], uuid_label: str) -> dict[str, float]:
    """{uuid: percent} from an instant vector; samples without the label or not finite are skipped.

    Several series for one device (e.g. scraped by two jobs) are averaged.
    """
    values: dict[str, list[float]] = {}
    for series in result:
        uuid = series.get("metric", {}).get(uuid_label)
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if uuid and math.isfinite(value):
            values.setdefault(uuid, []).append(value)
    return {uuid: sum(v) / len(v) for uuid, v in values.items()}


class PromUtilisation:
    def __init__(self, settings: PrometheusSettings) -> None:
        self.settings = settings
        # No retries: the next refresh is the retry, and a backing-off thread would outlive its timeout.
        self._client = PrometheusConnect(
            url=settings.url, disable_ssl=True, timeout=settings.timeout_s, retry=Retry(total=0, raise_on_status=False)
        )

    def _query(self) -> dict[str, float]:
        try:
            result = self._client.custom_query(query=self.settings.query)
        except Exception as exc:  # requests' and the client's own errors alike
            raise PromError(f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(result, list):  # pragma: no cover - Prometheus answers a vector to an instant query
            raise PromError(f"expected an instant vector, got {type(result).__name__}")
        return utilisation_by_uuid(result, self.settings.uuid_label)

    async def query(self) -> dict[str, float]:
        # The outer timeout also covers a thread stuck in DNS or connect; the thread then ends on its own.
        try:
            async with asyncio.timeout(self.settings.timeout_s * 2):
                return await asyncio.to_thread(self._query)
        except TimeoutError as exc:
            raise PromError("timeout") from exc
