"""YAML run configs: typed dataclass schemas, `key=value` overrides, errors that name the key.

A schema is a (nested) dataclass whose fields carry defaults; a YAML file (over the file its
`base` key names, if any) and command-line overrides (`learner.lr=1e-6`, dotted keys into
nested sections, values parsed as YAML) fill it. Everything is checked before any device work:
an unknown key, or a value of the wrong type, is a `UserError` naming the file, the key and the
value. A section's own checks (its `__post_init__`, raising `ConfigError` through `at_least`,
`probability` or with `config_key`) run as it is built, and again, with every other
section's, in `check` (after a config was changed in code). A section class names itself in
`SECTION` (its key in the YAML files).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Any, TypeVar

import yaml

from memagent_jax.errors import ConfigError, UserError

T = TypeVar("T")
BASE_KEY = "base"  # a config file's key naming the file it changes (`_read`)


def load_config(schema: type[T], path: str | None = None, overrides: list[str] = ()) -> T:
    """The schema's instance from the YAML file at `path` (None: defaults) and overrides."""
    values, files = _read(path, ()) if path is not None else ({}, [])
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"override '{item}': expected key=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        _check_override(schema, key.strip(), value, item)
        _set_dotted(values, key.strip(), value, item)
    source = path or "command line"
    if len(files) > 1:  # a bad key may be in any of them
        source += f" (over {', '.join(files[1:])})"
    return _build(schema, values, source, "")


def _read(path: str, chain: tuple[str, ...]) -> tuple[dict, list[str]]:
    """The YAML file's keys over those of the file its `base` key names (a path relative to
    this file's directory; bases may have bases): a step of a recipe states only what differs
    from the step it continues. Returns the keys and the files read, this one first. chain:
    the files that named this one, to refuse a loop."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a YAML config file")
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f) or {}
    except FileNotFoundError:
        named = f" (the base of {chain[-1]})" if chain else ""
        raise UserError(f"{path}: config file not found{named}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({_yaml_problem(e)})") from None
    if not isinstance(values, dict):
        raise UserError(f"{path}: expected a mapping of keys at the top level")
    base = values.pop(BASE_KEY, None)
    if base is None:
        return values, [path]
    if not isinstance(base, str):
        raise UserError(f"{path}: key '{BASE_KEY}' must be a config file's path, got {base!r}")
    base_path = os.path.normpath(os.path.join(os.path.dirname(path), base))
    if base_path in (*chain, os.path.normpath(path)):
        raise UserError(f"{path}: key '{BASE_KEY}': {base!r} is a loop of bases "
                        f"({' -> '.join([*chain, path, base_path])})")
    base_values, files = _read(base_path, (*chain, os.path.normpath(path)))
    return _merged(base_values, values), [path, *files]


def _merged(base: dict, values: dict) -> dict:
    """values over base, section by section (a section given in both keeps base's other
    keys); a list or a scalar replaces base's."""
    out = dict(base)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def to_dict(config) -> dict:
    """The config as plain YAML-able data (to save beside a run's outputs)."""
    def plain(value):
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(dataclasses.asdict(config))


def at_least(section, low: int, *names: str) -> None:
    """A section's check: each field's value is >= low, or None (ConfigError naming it)."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < low:
            raise ConfigError(config_key(section, name), f"must be at least {low}, got {value}")


def probability(section, name: str) -> None:
    """A section's check: the field's value is in (0, 1] (a top_p)."""
    if not 0 < getattr(section, name) <= 1:
        raise ConfigError(config_key(section, name),
                          f"must be in (0, 1], got {getattr(section, name)}")


def _check_override(schema: type, key: str, value, item: str) -> None:
    """The override's key exists and its value has the key's type: errors name the override,
    not the file it overrides."""
    source, kind, walked = f"override '{item}'", schema, ""
    for part in key.split("."):
        if not dataclasses.is_dataclass(kind):
            return  # a key inside a mapping (mesh.data): checked with the whole config
        fields = {f.name for f in dataclasses.fields(kind)}
        if part not in fields:
            raise UserError(f"{source}: unknown key '{walked}{part}' (known keys here: "
                            f"{', '.join(sorted(fields))})")
        kind, walked = typing.get_type_hints(kind)[part], f"{walked}{part}."
    _convert(kind, value, source, key)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """Where and what: 'line 3, column 5: mapping values are not allowed here'."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _set_dotted(values: dict, key: str, value, item: str) -> None:
    *parents, name = key.split(".")
    node = values
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"override '{item}': '{part}' is not a section")
        node = child
    node[name] = value


def _build(schema: type, values: dict, source: str, prefix: str, base=None):
    """The schema's instance from values; keys not given keep base's values (the enclosing
    config's default for this section, e.g. training's 64 decode slots), else the schema's."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key in values:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise UserError(f"{_at(source)}unknown key '{prefix}{key}' (known keys here: "
                            f"{known})")
    kwargs = {}
    for name, value in values.items():
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            kwargs[name] = _build(hints[name], value, source, f"{prefix}{name}.",
                                  _custom_default(fields[name], hints[name]))
        else:
            kwargs[name] = _convert(hints[name], value, source, prefix + name)
    try:
        return schema(**kwargs) if base is None else dataclasses.replace(base, **kwargs)
    except ConfigError as e:  # the section's own check
        raise UserError(f"{_at(source)}{e}") from None


def build_section(schema: type[T], values: dict, key: str) -> T:
    """A section that a plugin owns (held as a plain mapping by the config that names the
    plugin, e.g. `warmup`) from its keys, checked as `load_config` checks a schema's: a
    `ConfigError` naming `key.FIELD` (the enclosing file is named by the config's own check)."""
    try:
        return _build(schema, values, "", f"{key}.")
    except ConfigError:
        raise
    except UserError as e:
        raise ConfigError("", str(e)) from None


def _at(source: str) -> str:
    """The message's prefix naming where the values came from ("" in `build_section`)."""
    return f"{source}: " if source else ""


def _custom_default(field: dataclasses.Field, schema: type):
    """A section field's default when it differs from the section class's own defaults
    (`default_factory=lambda: EngineConfig(slots=64)`), else None."""
    factory = field.default_factory
    if factory is dataclasses.MISSING or factory is schema:
        return None
    return factory()


def check(config) -> None:
    """Runs the checks of every section of `config`, nested ones first (ConfigError)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            check(value)
    post_init = getattr(config, "__post_init__", None)
    if post_init is not None:
        post_init()


def config_key(section, name: str) -> str:
    """The config key of `section`'s field `name` ("learner.lr"; "steps" at the top level)."""
    prefix = getattr(section, "SECTION", "")
    return f"{prefix}.{name}" if prefix else name


def _convert(kind, value, source: str, key: str) -> Any:
    """value checked (and, where lossless, converted) against the annotation `kind`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return _convert(option, value, source, key)
            except UserError:
                continue
        raise _type_error(source, key, value, " or ".join(_name(o) for o in options))
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise _type_error(source, key, value, "a mapping")
        return _build(kind, value, source, key + ".")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _type_error(source, key, value, "a list")
        item = args[0] if args else Any
        items = [_convert(item, v, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(source, key, value, "a mapping")
        return {k: _convert(args[1], v, source, f"{key}.{k}") if args else v
                for k, v in value.items()}
    if origin is typing.Literal:
        if isinstance(value, bool):  # YAML reads a bare off (no, on, ...) as a boolean
            words = [a for a in args if isinstance(a, str) and yaml.safe_load(a) is value]
            value = words[0] if len(words) == 1 else value
        if value not in args:
            raise UserError(f"{_at(source)}key '{key}' must be one of "
                            f"{', '.join(map(repr, args))}, got {value!r}")
        return value
    if kind is Any:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        try:  # PyYAML reads 1e-6 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if kind in (int, float) and isinstance(value, bool):
        raise _type_error(source, key, value, _name(kind))
    if not isinstance(value, kind):
        raise _type_error(source, key, value, _name(kind))
    return value


def _type_error(source: str, key: str, value, expected: str) -> UserError:
    return UserError(f"{_at(source)}key '{key}' must be {expected}, got {value!r} "
                     f"({type(value).__name__})")


def _name(kind) -> str:
    return getattr(kind, "__name__", str(kind))
