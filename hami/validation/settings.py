"""Validation settings: which rules run in which mode, caps, quotas, exemptions, language.

Every field is a plain value (or the shared `ResourceNames`) so the config loader can map a YAML
section onto it by field name. Bad values fail here, at load time, never during a request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.quantity import QuantityError, bytes_to_mib, parse_quantity
from hami.requests import ResourceNames
from hami.validation.model import Mode

# Host-escape rules: no opt-out label can switch these off, only namespace/user/group exemptions.
SECURITY_RULES: tuple[str, ...] = (
    "privileged",
    "capabilities",
    "host-network",
    "host-pid",
    "host-ipc",
    "host-process",
    "runtime-socket",
)
# Rules a pod may skip with the opt-out label (when listed in `opt_out_rules`).
RESOURCE_RULES: tuple[str, ...] = (
    "gpu-count",
    "vgpu-memory-required",
    "vgpu-memory-max",
    "vgpu-granularity",
    "vgpu-range",
    "malformed-quantity",
    "extended-overcommit",
    "tenant-quota",
)
ALL_RULES: tuple[str, ...] = SECURITY_RULES + RESOURCE_RULES

# The embedded defaults: the two unambiguous escapes (privileged, runtime socket) and every resource
# rule deny; the other host-escape rules warn, as some system agents legitimately use them.
DEFAULT_RULE_MODES: dict[str, str] = {
    "privileged": "enforce",
    "capabilities": "warn",
    "host-network": "warn",
    "host-pid": "warn",
    "host-ipc": "warn",
    "host-process": "warn",
    "runtime-socket": "enforce",
    "gpu-count": "enforce",
    "vgpu-memory-required": "enforce",
    "vgpu-memory-max": "enforce",
    "vgpu-granularity": "enforce",
    "vgpu-range": "enforce",
    "malformed-quantity": "enforce",
    "extended-overcommit": "enforce",
    "tenant-quota": "enforce",
}
QUOTA_KEYS = ("memory", "cores", "gpus")
UNCAPPED = -1


@dataclass(frozen=True, slots=True)
class Quota:
    """A namespace's caps, parsed; None means no cap on that dimension."""

    memory_mib: int | None = None
    cores: int | None = None
    gpus: int | None = None

    @property
    def bounded(self) -> bool:
        """Whether any dimension is capped: only then is the namespace's usage worth counting."""
        return self.memory_mib is not None or self.cores is not None or self.gpus is not None


def _rule_mode(value: Any, rule: str) -> Mode:
    """A rule's setting is a mode string or {enabled: bool, mode: str}."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"enabled", "mode"}
        if unknown:
            raise ValueError(f"validation.rules.{rule}: unknown keys {sorted(unknown)}")
        if value.get("enabled", True) is False:
            return Mode.OFF
        value = value.get("mode", DEFAULT_RULE_MODES[rule])
    if isinstance(value, bool):  # YAML `off` parses as False, `on` as True
        return Mode(DEFAULT_RULE_MODES[rule]) if value else Mode.OFF
    try:
        return Mode(str(value).lower())
    except ValueError:
        raise ValueError(
            f"validation.rules.{rule}: {value!r} is not a mode ({', '.join(m.value for m in Mode)})"
        ) from None


def _quota(value: Any, where: str) -> Quota:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping of {', '.join(QUOTA_KEYS)}")
    unknown = set(value) - set(QUOTA_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (expected {', '.join(QUOTA_KEYS)})")
    memory = value.get("memory")
    memory_mib: int | None = None
    if memory is not None:
        # A bare number is MiB (HAMi's unit); a string with a suffix is a byte quantity ("64Gi").
        try:
            if isinstance(memory, int) and not isinstance(memory, bool):
                memory_mib = memory
            elif isinstance(memory, str) and memory.strip().isdigit():
                memory_mib = int(memory)
            else:
                memory_mib = bytes_to_mib(parse_quantity(memory))
        except (QuantityError, OverflowError, ValueError) as exc:
            raise ValueError(f"{where}.memory: {exc}") from None
    caps = {"memory": memory_mib}
    for key in ("cores", "gpus"):
        raw = value.get(key)
        if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool)):
            raise ValueError(f"{where}.{key}: {raw!r} is not an integer")
        caps[key] = raw
    for key, cap in caps.items():
        if cap is not None and cap < 0:
            raise ValueError(f"{where}.{key}: must not be negative")
    return Quota(caps["memory"], caps["cores"], caps["gpus"])


@dataclass(frozen=True, slots=True)
class ValidationSettings:
    # rule id -> mode ("enforce" | "warn" | "audit" | "off") or {enabled: bool, mode: str};
    # rules left out keep DEFAULT_RULE_MODES.
    rules: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_RULE_MODES))
    # Namespaces never validated (fnmatch patterns): the system's and the webhook's own, so a broken
    # webhook can always be repaired.
    exempt_namespaces: tuple[str, ...] = ("kube-system", "hami-system")
    # Requesting users never validated (fnmatch patterns, e.g. "system:serviceaccount:ci:deployer").
    exempt_users: tuple[str, ...] = ()
    # Requesting groups never validated. Not "system:serviceaccounts:kube-system" by default: the
    # replicaset/job controllers create every controller pod under that group, which would skip the
    # quota check of all replicas.
    exempt_groups: tuple[str, ...] = ()
    # Pod label (and value) that skips the rules in `opt_out_rules`; never a host-escape rule.
    opt_out_label: str = "hami.io/policy-opt-out"
    opt_out_value: str = "true"
    # The rules the opt-out label skips (security rules are refused here).
    opt_out_rules: tuple[str, ...] = RESOURCE_RULES
    # GPUs one pod may ask (Kubernetes' effective request, all count names summed); -1 = uncapped.
    gpu_cap_default: int = 2
    # Per-namespace caps overriding the default; -1 = uncapped.
    gpu_cap_namespaces: dict[str, int] = field(default_factory=lambda: {"ai-core-production": UNCAPPED})
    # Card size used when the live inventory is empty (80 GiB: A100/H100 80G).
    largest_card_mib_fallback: int = 81920
    # vGPU memory must be a multiple of this many MiB; 0 disables the check.
    memory_granularity_mib: int = 256
    # namespace -> {memory: MiB int or quantity "64Gi", cores: percent sum, gpus: count}; absent = no cap.
    quotas: dict[str, Any] = field(default_factory=dict)
    # Quota for namespaces not listed in `quotas`; empty = uncapped.
    default_quota: dict[str, Any] = field(default_factory=dict)
    # More runtime socket paths (besides the built-in docker/containerd/cri-o/k3s ones) never to mount.
    extra_runtime_sockets: tuple[str, ...] = ()
    # Message language: "en" or "zh".
    language: str = "en"
    # Resource names meaning GPU count, memory and cores.
    resources: ResourceNames = field(default_factory=ResourceNames)
    # Parsed once in __post_init__ (the request path only looks them up); not settable.
    _modes: dict[str, Mode] = field(init=False, repr=False, compare=False, default_factory=dict)
    _quotas: dict[str, Quota] = field(init=False, repr=False, compare=False, default_factory=dict)
    _default_quota: Quota = field(init=False, repr=False, compare=False, default_factory=Quota)

    def __post_init__(self) -> None:
        unknown = set(self.rules) - set(ALL_RULES)
        if unknown:
            raise ValueError(f"validation.rules: unknown rules {sorted(unknown)} (known: {', '.join(ALL_RULES)})")
        modes = {rule: _rule_mode(self.rules.get(rule, DEFAULT_RULE_MODES[rule]), rule) for rule in ALL_RULES}
        object.__setattr__(self, "_modes", modes)
        bad = set(self.opt_out_rules) - set(RESOURCE_RULES)
        if bad:
            raise ValueError(f"validation.opt_out_rules: {sorted(bad)} cannot be opted out of")
        if self.language not in ("en", "zh"):
            raise ValueError(f"validation.language: {self.language!r} (expected 'en' or 'zh')")
        if self.memory_granularity_mib < 0 or self.largest_card_mib_fallback <= 0:
            raise ValueError("validation: memory_granularity_mib must be >= 0, largest_card_mib_fallback > 0")
        for namespace, cap in {"(default)": self.gpu_cap_default, **self.gpu_cap_namespaces}.items():
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < UNCAPPED:
                raise ValueError(f"validation.gpu_cap {namespace}: {cap!r} (an integer >= 0, or -1 = uncapped)")
        quotas = {ns: _quota(quota, f"validation.quotas.{ns}") for ns, quota in self.quotas.items()}
        object.__setattr__(self, "_quotas", quotas)
        object.__setattr__(self, "_default_quota", _quota(self.default_quota, "validation.default_quota"))

    def mode(self, rule: str) -> Mode:
        return self._modes[rule]

    def gpu_cap(self, namespace: str) -> int:
        return self.gpu_cap_namespaces.get(namespace, self.gpu_cap_default)

    def quota(self, namespace: str) -> Quota:
        return self._quotas.get(namespace, self._default_quota)

    def with_overrides(self, overrides: Mapping[str, Any]) -> ValidationSettings:
        """A copy with some fields replaced (tests, corpus variants); `rules` merges into the current."""
        changes = dict(overrides)
        if "rules" in changes:
            changes["rules"] = {**self.rules, **changes["rules"]}
        if isinstance(changes.get("resources"), Mapping):
            changes["resources"] = ResourceNames(
                **{k: tuple(v) for k, v in changes["resources"].items()}  # YAML lists -> tuples
            )
        for name in ("exempt_namespaces", "exempt_users", "exempt_groups", "opt_out_rules", "extra_runtime_sockets"):
            if name in changes:
                changes[name] = tuple(changes[name])
        return dataclasses.replace(self, **changes)
