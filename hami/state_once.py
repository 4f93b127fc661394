"""One snapshot from the configured state sources, then stop (`hami_webhook.py snapshot`)."""

from __future__ import annotations

from hami.config import Config
from hami.state.collector import start_state
from hami.state.model import Snapshot


async def first_snapshot(config: Config, timeout_s: float = 15.0) -> Snapshot:
    layer = await start_state(config.state)
    try:
        await layer.collector.wait_ready(timeout_s)
        return layer.collector.snapshot
    finally:
        await layer.close()
