"""YAML run configs: typed dataclass schemas, `key=value` overrides, errors that name the key.

A schema is a (nested) dataclass whose fields carry defaults; a YAML file (over the file its
`base` key names, if any) and command-line overrides (`learner.lr=1e-6`, dotted keys into
nested sections, values parsed as YAML) fill it. Everything is checked before any device work:
an unknown key, or a value of the wrong type, is a `UserError` naming the file, the key and the
value. A section's own checks (its `__post_init__`, raising `ConfigError` through `at_least`,
`probability` or with `config_key`) run as it is built, and again, with every other
section's, in `check` (after a config was changed in code); what a command builds from a
loaded config (an agent, a plugin) checks inside `located`, its errors naming the file too.
A section class names itself in
`SECTION` (its key in the YAML files). A command's top-level schema names its command in
`COMMAND` and, in `OTHER_CONFIGS`, the top-level keys only another command's configs have,
so that a file given to the wrong command is named as what it is. A key a section no longer
has is named as such: in `MOVED` (its new place) or `REMOVED` (the value it now always has,
and why; a file giving that value, as an older run's saved config does for every key, loads).

`write_config` keeps a resolved config as YAML that loads back to the same config, and
`differences` names what changed between two configs (a resumed run's checks: `train`,
`eval`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

import yaml

from memagent_jax.errors import ConfigError, UserError

T = TypeVar("T")
BASE_KEY = "base"  # a config file's key naming the file it changes (`_read`)
_SOURCE = "_config_source"  # where a loaded config's values came from (`located`)


def load_config(schema: type[T], path: str | None = None, overrides: Sequence[str] = ()) -> T:
    """The schema's instance from the YAML file at `path` (None: defaults) and overrides."""
    values, files = _read(path, ()) if path is not None else ({}, [])
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"override '{item}': expected key=value")
        try:
            value = load_yaml(text)
        except yaml.YAMLError:
            value = text
        _check_override(schema, key.strip(), value, item)
        _set_dotted(values, key.strip(), value, item)
    source = path or "command line"
    if len(files) > 1:  # a bad key may be in any of them
        source += f" (over {', '.join(files[1:])})"
    config = _build(schema, values, source, "")
    object.__setattr__(config, _SOURCE, source)  # not a field: no key, no part of equality
    return config


@contextlib.contextmanager
def located(config):
    """Where a command checks a loaded config beyond its schema (building what its sections
    name: an agent, a plugin), a `ConfigError` raised inside is a `UserError` naming where the
    config's values came from, as `load_config`'s own checks are."""
    try:
        yield
    except ConfigError as e:
        raise UserError(f"{_at(getattr(config, _SOURCE, ''))}{e}") from None


def _read(path: str, chain: tuple[str, ...]) -> tuple[dict, list[str]]:
    """The YAML file's keys over those of the file its `base` key names (a path relative to
    this file's directory; bases may have bases): a step of a recipe states only what differs
    from the step it continues. Returns the keys and the files read, this one first. chain:
    the files that named this one, to refuse a loop."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a YAML config file")
    try:
        with open(path, encoding="utf-8") as f:
            values = load_yaml(f) or {}
    except FileNotFoundError:
        named = f" (the base of {chain[-1]})" if chain else ""
        raise UserError(f"{path}: config file not found{named}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({_yaml_problem(e)})") from None
    except UnicodeDecodeError as e:  # a binary file, or text in another encoding
        raise UserError(f"{path}: not a YAML text file (not UTF-8: {e.reason})") from None
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (PyYAML keeps the
    last one silently: the first would be a setting that looks set and is not)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                # "<<" merges another mapping, whose keys a mapping may override.
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' given twice, first on line {seen[key]}",
                        key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(text):
    """yaml.safe_load of `text` (a string or a file), a key given twice in a mapping refused
    (yaml.YAMLError): every config file, override and section given as YAML is read so."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


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


def write_config(config, path: str, comment: str) -> None:
    """The config as YAML at `path` (`comment`'s lines first, as comments), keys in the schema's
    order; written to a temporary file renamed into place, so the file is whole or absent.
    `load_config` reads it back to an equal config."""
    text = "".join(f"# {line}\n" for line in comment.splitlines())
    text += yaml.safe_dump(to_dict(config), sort_keys=False)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def differences(old, new, keep: tuple[str, ...] = (), key: str = "") -> list[str]:
    """Where two configs (or parts of them) as plain data (`to_dict`, JSON) differ, one entry per
    dotted key, in `new`'s order: "learner.lr was 0.001, now 0.0003". The keys in `keep`, and
    the keys under them, may differ: they are left out."""
    if key in keep:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        names = [*new, *(name for name in old if name not in new)]  # the schema's order
        return [change for name in names
                for change in differences(old.get(name), new.get(name), keep,
                                          f"{key}.{name}" if key else str(name))]
    return [] if old == new else [f"{key} was {old!r}, now {new!r}"]


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
            raise _unknown_key(f"{source}: ", walked + part, kind)
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
    removed = getattr(schema, "REMOVED", {})
    # Dropped only at the value itself, of its type: 1 for True would pass no type check.
    values = {key: value for key, value in values.items()
              if not (key in removed and type(value) is type(removed[key][0])
                      and value == removed[key][0])}
    unknown = [key for key in values if key not in fields]
    if unknown and not prefix:
        _check_command(schema, unknown, source)
    if unknown:
        raise _unknown_key(_at(source), prefix + unknown[0], schema)
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


def _unknown_key(at: str, key: str, schema: type) -> UserError:
    """"unknown key 'learner.lrr' (did you mean 'learner.lr'?)": the section's keys close to
    the one given; where none is, the section's keys when they are few, else the schema that
    holds them (a section of 30 keys listed in full hides the one the user meant). A key the
    schema lists in `MOVED` names its new place; one in `SYNONYMS` (another framework's name,
    learning_rate for lr, which no spelling is close to) comes first among the close ones; one
    in `REMOVED` (given another value than the one it now always has) says what is left."""
    *parents, name = key.split(".")
    section = "".join(f"{part}." for part in parents)
    known = sorted(f.name for f in dataclasses.fields(schema))
    moved = getattr(schema, "MOVED", {}).get(name)
    if moved:
        return UserError(f"{at}unknown key '{key}': it is '{moved}' now")
    removed = getattr(schema, "REMOVED", {}).get(name)
    if removed:
        return UserError(f"{at}key '{key}' was removed: {removed[1]}; delete it")
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    synonym = getattr(schema, "SYNONYMS", {}).get(name)
    if synonym:
        close = [synonym] + [c for c in close if c != synonym][:2]
    if close:
        hint = "did you mean " + " or ".join(f"'{section}{c}'" for c in close) + "?"
    elif len(known) <= 10:
        hint = f"known keys here: {', '.join(known)}"
    else:
        hint = (f"none of the {len(known)} keys here is close; they are the fields of "
                f"{schema.__module__}.{schema.__qualname__}")
    return UserError(f"{at}unknown key '{key}' ({hint})")


def _check_command(schema: type, unknown: list[str], source: str) -> None:
    """Raises where a file's unknown top-level keys are another command's (`OTHER_CONFIGS`):
    an eval config given to `train` is named as one, not as an unknown key."""
    for command, keys in getattr(schema, "OTHER_CONFIGS", {}).items():
        found = [repr(key) for key in unknown if key in keys]
        if found:
            shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            ours = getattr(schema, "COMMAND")  # noqa: B009 - a schema with OTHER_CONFIGS names its own
            raise UserError(f"{_at(source)}a config for `memagent-jax {command}` (it has "
                            f"{shown}), not for `memagent-jax {ours}`: run it with "
                            f"`memagent-jax {command} --config`")


def build_section(schema: type[T], values: dict, key: str) -> T:
    """A section that a plugin owns (held as a plain mapping by the config that names the
    plugin, e.g. `plugin`) from its keys, checked as `load_config` checks a schema's: a
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
        sections = [o for o in options if isinstance(o, type) and dataclasses.is_dataclass(o)]
        if isinstance(value, dict) and len(sections) == 1:  # its own errors name its keys
            return _convert(sections[0], value, source, key)
        for option in options:
            try:
                return _convert(option, value, source, key)
            except UserError:
                continue
        raise _type_error(source, key, value, " or ".join(_name(o) for o in options))
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
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
