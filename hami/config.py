"""The webhook's one typed configuration: embedded defaults <- YAML file <- HAMI_* env <- flags.

`config/webhook.yaml` documents every key with its default (a test keeps it equal to the
dataclass defaults here). The policy sections (validation, placement, mutation) reload when the
file changes; the rest needs a restart, and a reload that touches it says so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hami.placement.settings import PlacementSettings
from hami.settings_loader import SettingsError, build
from hami.state.settings import StateSettings
from hami.validation.settings import ValidationSettings

ENV_PREFIX = "HAMI_"
POLICY_SECTIONS = ("validation", "placement", "mutation")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The HTTPS listener and the answers of last resort."""

    listen: str = "127.0.0.1:8443"  # HOST:PORT of the HTTPS listener
    state_dir: str = ".state"  # self-generated certificates live here
    max_body_bytes: int = 3 * 1024 * 1024  # kube-apiserver sends at most 3 MiB objects
    on_internal_error: Literal["allow", "deny"] = "deny"  # answer when the decision code raises
    config_poll_s: float = 2.0  # how often the config and certificate files are checked for changes
    shutdown_grace_s: float = 5.0  # in-flight admissions finish within this on SIGTERM
    # Each applied sweep's state is frozen out of the cyclic GC (its full collections paused
    # admissions for ~260 ms at 10,000 nodes); everything is handed back once per this many seconds,
    # so cycles frozen meanwhile are still freed. 0: never freeze.
    gc_unfreeze_s: float = 300.0

    def check(self) -> None:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"listen: must be HOST:PORT, got {self.listen!r}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes: must be at least 1024")
        if self.gc_unfreeze_s < 0:
            raise ValueError("gc_unfreeze_s: must be 0 (never freeze) or more")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Serving certificate (reloaded in place when the files change) and optional client verification."""

    cert_file: str = ""  # empty: generate a CA and serving certificate into server.state_dir
    key_file: str = ""
    client_ca: str = ""  # PEM bundle; when set, clients (kube-apiserver) must present a certificate it signed
    service_name: str = "hami-webhook"  # names the generated certificate covers (SANs)
    service_namespace: str = "hami-system"
    extra_sans: tuple[str, ...] = ()  # more DNS names or IP addresses for the generated certificate

    def check(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file: set both or neither")


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    """One JSON line per admission decision, on stdout."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


@dataclass(frozen=True, slots=True)
class MutationSettings:
    """How a placement decision is written into the pod, and what happens when nothing fits."""

    placement: Literal["pin", "shortlist"] = "pin"  # pin: one node + devices; shortlist: top-K nodes, no devices
    shortlist_k: int = 3
    on_no_fit: Literal["deny", "allow", "queue"] = "deny"
    allow_priority_at_or_above: int = 1_000_000_000  # such pods get `allow` so kube-scheduler can preempt
    hands_off_schedulers: tuple[str, ...] = ("hami-scheduler", "volcano")  # placement left to them
    scheduling_gate: str = "hami.io/gpu-capacity"  # the gate `queue` adds and the collector removes
    topology_key: str = "kubernetes.io/hostname"

    def check(self) -> None:
        if self.shortlist_k < 1:
            raise ValueError("shortlist_k: must be at least 1")


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    server: ServerSettings = field(default_factory=ServerSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    validation: ValidationSettings = field(default_factory=ValidationSettings)
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    mutation: MutationSettings = field(default_factory=MutationSettings)
    state: StateSettings = field(default_factory=StateSettings)


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """HAMI_SERVER__LISTEN=0.0.0.0:8443 -> {"server": {"listen": "0.0.0.0:8443"}}.

    Values are read as YAML scalars/flow collections, so `true`, `3`, `[a, b]` keep their types.
    """
    tree: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise SettingsError(f"{'.'.join(path)}: {name} is not valid YAML: {exc}") from None
        _set_path(tree, path, value)
    return tree


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_file(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path}: must be a mapping of sections")
    return data


def load(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    data: dict[str, Any] = read_file(path) if path else {}
    data = merge(data, env_overrides(os.environ if environ is None else environ))
    data = merge(data, overrides or {})
    return build(Config, data)


def with_policy_of(current: Config, new: Config) -> tuple[Config, list[str]]:
    """Take the policy sections of `new`; list the other sections that changed (need a restart)."""
    replaced = dataclasses.replace(current, **{s: getattr(new, s) for s in POLICY_SECTIONS if hasattr(new, s)})
    restart = [
        f.name
        for f in dataclasses.fields(Config)
        if f.name not in POLICY_SECTIONS and getattr(current, f.name) != getattr(new, f.name)
    ]
    return replaced, restart
