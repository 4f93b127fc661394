"""Build frozen settings dataclasses from plain YAML data, naming the key of any bad value.

Every settings class in the project is a frozen dataclass of plain types with defaults; this module
is the one place that turns untrusted mappings into them, so a typo in a ConfigMap stops start-up
with "placement.on_no_fit: must be one of deny, allow, queue" instead of a traceback later.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class SettingsError(ValueError):
    """An invalid setting; str() starts with the dotted key."""


def _describe(value: Any) -> str:
    return f"{value!r}" if not isinstance(value, (dict, list)) else type(value).__name__


def coerce(tp: Any, value: Any, key: str) -> Any:
    """Check/convert `value` to type `tp`. Only lossless conversions (int -> float, list -> tuple)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(option, value, key)
            except SettingsError as exc:
                errors.append(str(exc))
        raise SettingsError(errors[0] if len(errors) == 1 else f"{key}: {_describe(value)} is not valid")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise SettingsError(f"{key}: must be one of {', '.join(map(str, allowed))}, got {_describe(value)}")
        return value
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise SettingsError(
                f"{key}: must be one of {', '.join(str(m.value) for m in tp)}, got {_describe(value)}"
            ) from None
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return build(tp, value, key)
    if origin in (tuple,):
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{key}: must be a list, got {_describe(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(args[0], item, f"{key}[{i}]") for i, item in enumerate(value))
        if len(args) != len(value):
            raise SettingsError(f"{key}: must have {len(args)} items")
        return tuple(coerce(a, item, f"{key}[{i}]") for i, (a, item) in enumerate(zip(args, value, strict=True)))
    if origin in (frozenset, set):
        (arg,) = get_args(tp)
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise SettingsError(f"{key}: must be a list, got {_describe(value)}")
        return frozenset(coerce(arg, item, f"{key}[{i}]") for i, item in enumerate(value))
    if origin in (dict, Mapping, typing.Mapping) or tp in (dict,):
        key_type, value_type = get_args(tp) or (Any, Any)
        if not isinstance(value, Mapping):
            raise SettingsError(f"{key}: must be a mapping, got {_describe(value)}")
        return {coerce(key_type, k, f"{key}.{k}"): coerce(value_type, v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise SettingsError(f"{key}: must be true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(f"{key}: must be an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{key}: must be a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SettingsError(f"{key}: must be a string, got {_describe(value)}")
        return value
    raise SettingsError(f"{key}: unsupported setting type {tp!r}")


def build(cls: type[T], data: Any, prefix: str = "") -> T:
    """Instantiate dataclass `cls` from a mapping; unknown keys are errors (typos must not pass)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SettingsError(f"{prefix or 'config'}: must be a mapping, got {_describe(data)}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise SettingsError(f"{where}{unknown[0]}: unknown setting (known: {', '.join(sorted(fields))})")
    kwargs = {
        name: coerce(hints[name], data[name], f"{prefix}.{name}" if prefix else name) for name in fields if name in data
    }
    try:
        instance = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{prefix or 'config'}: {exc}") from None
    validate_hook = getattr(instance, "check", None)
    if callable(validate_hook):
        try:
            validate_hook()
        except ValueError as exc:
            raise SettingsError(f"{prefix + '.' if prefix else ''}{exc}") from None
    return instance


def to_plain(value: Any) -> Any:
    """Settings back to plain data (for `config --dump` and tests)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list, frozenset, set)):
        return [to_plain(v) for v in value]
    return value
