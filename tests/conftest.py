"""Shared fixtures. The webhook fixture is a real server on a real HTTPS socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.webhook_fixture import Webhook, running_webhook

pytest_plugins = ["tests.servers"]  # real redis-server, prometheus and agent processes


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    async with running_webhook(tmp_path) as hook:
        yield hook
