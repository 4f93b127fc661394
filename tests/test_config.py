"""Configuration: defaults, the documented file, env overrides, invalid values, hot reload."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hami import config as config_mod
from hami.config import Config
from hami.settings_loader import SettingsError, to_plain
from tests.webhook_fixture import running_webhook

ROOT = Path(__file__).resolve().parent.parent


def test_documented_file_equals_embedded_defaults() -> None:
    """config/webhook.yaml documents every key with its default: it must load to exactly Config()."""
    documented = config_mod.load(ROOT / "config" / "webhook.yaml", environ={})
    assert to_plain(documented) == to_plain(Config())
    raw = yaml.safe_load((ROOT / "config" / "webhook.yaml").read_text())
    assert set(raw) == set(to_plain(Config())), "every section is documented"
    for section, values in to_plain(Config()).items():
        assert set(raw[section]) == set(values), f"every key of {section} is documented"


def test_documented_file_is_generated_from_the_code() -> None:
    """Regenerate with: python hami_webhook.py config --documented > config/webhook.yaml"""
    from hami.config_doc import documented_yaml

    assert (ROOT / "config" / "webhook.yaml").read_text() == documented_yaml()


def test_env_overrides_file_and_keep_types(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  listen: 127.0.0.1:9000\nmutation:\n  shortlist_k: 2\n")
    cfg = config_mod.load(
        path,
        environ={
            "HAMI_SERVER__LISTEN": "0.0.0.0:8443",
            "HAMI_MUTATION__SHORTLIST_K": "5",
            "HAMI_MUTATION__HANDS_OFF_SCHEDULERS": "[volcano]",
            "UNRELATED": "x",
        },
    )
    assert cfg.server.listen == "0.0.0.0:8443"
    assert cfg.mutation.shortlist_k == 5
    assert cfg.mutation.hands_off_schedulers == ("volcano",)


def test_flags_override_env() -> None:
    cfg = config_mod.load(None, environ={"HAMI_SERVER__LISTEN": "0.0.0.0:1"}, overrides={"server": {"listen": "h:2"}})
    assert cfg.server.listen == "h:2"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"server": {"listn": "x"}}, "server.listn"),
        ({"server": {"listen": "no-port"}}, "listen"),
        ({"server": {"max_body_bytes": "3Mi"}}, "server.max_body_bytes"),
        ({"server": {"on_internal_error": "maybe"}}, "server.on_internal_error"),
        ({"mutation": {"shortlist_k": 0}}, "shortlist_k"),
        ({"tls": {"cert_file": "/a"}}, "cert_file"),
        ({"nosuchsection": {}}, "nosuchsection"),
        ({"mutation": {"hands_off_schedulers": "volcano"}}, "mutation.hands_off_schedulers"),
    ],
)
def test_invalid_values_name_the_key(data: dict, key: str) -> None:
    with pytest.raises(SettingsError, match=key.replace(".", r"\.")):
        config_mod.load(None, environ={}, overrides=data)


def test_invalid_config_stops_start_up_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("server:\n  on_internal_error: sometimes\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "hami_webhook.py"), "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    assert "server.on_internal_error" in result.stderr
    assert "Traceback" not in result.stderr


async def test_policy_hot_reload_good_then_bad(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text("mutation:\n  on_no_fit: deny\nserver:\n  config_poll_s: 0.05\n")
    async with running_webhook(tmp_path, config_path=str(path)) as hook:
        runtime = hook.server.runtime
        assert runtime.config.mutation.on_no_fit == "deny"
        path.write_text("mutation:\n  on_no_fit: allow\nserver:\n  config_poll_s: 0.05\n")
        for _ in range(100):
            if runtime.config.mutation.on_no_fit == "allow":
                break
            await asyncio.sleep(0.02)
        assert runtime.config.mutation.on_no_fit == "allow"
        path.write_text("mutation:\n  on_no_fit: sometimes\nserver:\n  config_poll_s: 0.05\n")
        await asyncio.sleep(0.3)
        assert runtime.config.mutation.on_no_fit == "allow", "a bad file keeps the old policy"
        path.write_text("mutation:\n  on_no_fit: queue\n  shortlist_k: 4\nserver:\n  config_poll_s: 0.05\n")
        for _ in range(100):
            if runtime.config.mutation.on_no_fit == "queue":
                break
            await asyncio.sleep(0.02)
        assert runtime.config.mutation.shortlist_k == 4


def test_config_command_prints_effective_config() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hami_webhook.py"), "config"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={"HAMI_SERVER__LISTEN": "0.0.0.0:9443", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["server"]["listen"] == "0.0.0.0:9443"


def test_readme_reference_table_matches_the_code() -> None:
    """Regenerate with: python hami_webhook.py config --reference (paste into README.md)."""
    from hami.config_doc import reference_table

    assert reference_table() in (ROOT / "README.md").read_text()
