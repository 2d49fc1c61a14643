"""Building blocks shared by the config sections.

A section is a frozen dataclass whose fields are declared with ``opt`` (has a default) or ``required``; the
field metadata holds the doc line and the bounds (``ge``, ``gt``, ``le``, ``lt``, ``multiple_of``,
``pattern``). ``read_section`` checks a YAML mapping against such a class and reports every problem to a
``Problems`` collector; fields whose value is bad are left out of the result so the dataclass default
stands in and the check can go on to find the next problem.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

RELATIVE_NOTE = "paths are relative to the config file's folder"


def opt(default: Any, doc: str, **rules: Any) -> Any:
    """A config field with a default; ``rules`` are bounds and notes (see module docstring)."""
    return field(default=default, metadata={"doc": doc, **rules})


def required(doc: str, **rules: Any) -> Any:
    """A config field the user must give."""
    return field(metadata={"doc": doc, **rules})


class Invalid(Exception):
    """A value failed a check. ``message`` says what was expected and what was found; ``path`` is the key path
    of the bad value (a list item may be deeper than the key being read)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


@dataclass
class Problems:
    """Collects problems with their key paths and turns them into ``file:line: path: message`` lines."""

    source: str
    base_dir: Path
    marks: Mapping[str, int]
    items: list[tuple[int, str, str]] = field(default_factory=list)
    bad: set[str] = field(default_factory=set)

    def add(self, path: str, message: str) -> None:
        self.items.append((self.line(path) or 0, path, message))
        self.bad.add(path)

    def ok(self, *paths: str) -> bool:
        """True when no problem was reported at any of ``paths`` (cross-checks skip reported values)."""
        return not any(p in self.bad for p in paths)

    def line(self, path: str) -> int | None:
        """The line of ``path``, else of the nearest enclosing key that has one."""
        current: str | None = path
        while current is not None:
            if current in self.marks:
                return self.marks[current]
            current = parent_path(current)
        return None

    def messages(self) -> list[str]:
        lines = []
        for line, path, message in sorted(self.items, key=lambda item: item[0]):
            where = f"{self.source}:{line}" if line else self.source
            lines.append(f"{where}: {path}: {message}" if path else f"{where}: {message}")
        return lines


def key_path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


_LAST_PART = re.compile(r"(?:\.[^.\[\]]*|\[\d+\])$")


def parent_path(path: str) -> str | None:
    """``streams[0].url`` -> ``streams[0]`` -> ``streams`` -> ``""`` -> None."""
    if not path:
        return None
    match = _LAST_PART.search(path)
    return path[: match.start()] if match else ""


def describe(value: object) -> str:
    """A value as a message shows it after 'got'."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int):
        return f"{value} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return "a mapping (key: value pairs)"
    return f"a {type(value).__name__} ({value!r})"


def suggest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` when ``word`` is close to one of ``choices``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not close and word.lower() != word:
        close = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_keys(
    raw: Mapping[Any, Any],
    valid: Iterable[str],
    path: str,
    problems: Problems,
    ignore: Callable[[str], bool] | None = None,
    homes: Mapping[str, str] | None = None,
) -> None:
    """Report every key of ``raw`` not in ``valid``, with the closest valid key, or the section the key
    belongs in (``homes``: key -> section), or the list of valid keys."""
    valid = list(valid)
    for key in raw:
        if not isinstance(key, str):
            problems.add(key_path(path, str(key)), f"keys must be names, got {describe(key)}")
        elif key not in valid and not (ignore and ignore(key)):
            home = (homes or {}).get(key)
            hint = (
                f"; {key} belongs under {home}:"
                if home
                else suggest(key, valid) or f"; valid keys here: {', '.join(valid)}"
            )
            problems.add(key_path(path, key), f"unknown key{hint}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def default_of(cls: type, name: str) -> Any:
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    raise KeyError(name)


def value_of(cls: type, given: Mapping[str, Any], name: str) -> Any:
    """The checked value of ``name`` if it was given, else the default of the field."""
    return given[name] if name in given else default_of(cls, name)


def read_section(
    cls: type,
    raw: object,
    path: str,
    problems: Problems,
    *,
    special: Mapping[str, Callable[[object, str], Any]] | None = None,
    extra_keys: Iterable[str] = (),
    what: str = "",
) -> dict[str, Any] | None:
    """Check the mapping ``raw`` against the init fields of the dataclass ``cls``.

    Returns keyword arguments for ``cls`` holding only the keys that were given and are valid (None when
    ``raw`` is not a mapping). ``special`` maps a field name to a checker ``(value, path) -> value`` that
    raises Invalid; other fields are checked by their type and bounds.
    """
    known = [f for f in fields(cls) if f.init]
    names = [f.name for f in known]
    if not isinstance(raw, dict):
        expected = what or f"a mapping with the keys {', '.join(names)}"
        problems.add(path, f"expected {expected}, got {describe(raw)}")
        return None
    check_keys(raw, [*extra_keys, *names], path, problems)
    special = special or {}
    hints = _hints(cls)
    out: dict[str, Any] = {}
    for f in known:
        here = key_path(path, f.name)
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if f.name not in raw:
            if not has_default:
                problems.add(
                    here, f"required key missing; add {f.name}: ({f.metadata.get('ask', f.metadata['doc'])})"
                )
            continue
        value = raw[f.name]
        try:
            if f.name in special:
                out[f.name] = special[f.name](value, here)
            elif value is None:
                fix = (
                    f"delete the key to use the default ({show(default_of(cls, f.name))})"
                    if has_default
                    else ""
                )
                raise Invalid(
                    f"expected {expectation(hints[f.name], f.metadata)}, got nothing; give a value"
                    + (" or " + fix if fix else ""),
                    here,
                )
            else:
                out[f.name] = coerce(value, hints[f.name], f.metadata, here)
        except Invalid as exc:
            problems.add(exc.path, exc.message)
    return out


def show(value: object) -> str:
    """A default as YAML would spell it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, Path):
        return str(value)
    return repr(value) if isinstance(value, str) else str(value)


def _bounds(meta: Mapping[str, Any], each: bool = False) -> str:
    ge, gt, le, lt = (meta.get(k) for k in ("ge", "gt", "le", "lt"))
    if ge is not None and le is not None:
        parts = [f"between {ge} and {le}"]
    else:
        parts = [
            f"{sign} {bound}"
            for sign, bound in ((">=", ge), (">", gt), ("<", lt), ("<=", le))
            if bound is not None
        ]
    text = (" " + " and ".join(parts)) if parts else ""
    if meta.get("multiple_of"):
        text += f", {'each ' if each else ''}a multiple of {meta['multiple_of']}"
    return text


def expectation(hint: Any, meta: Mapping[str, Any]) -> str:
    """What a valid value of a field looks like, in words."""
    origin = get_origin(hint)
    if hint is bool:
        text = "true or false"
    elif hint is int:
        text = "an integer" + _bounds(meta)
    elif hint is float:
        text = "a number" + _bounds(meta)
    elif hint is str:
        text = meta.get("pattern_doc", "a non-empty string")
    elif origin is Literal:
        text = "one of " + ", ".join(repr(a) for a in get_args(hint))
    elif origin is tuple:
        args = get_args(hint)
        noun = {int: "integers", float: "numbers", str: "strings"}.get(args[0], "values")
        shape = f" {meta['shape']}" if meta.get("shape") else ""
        text = f"a list{shape} of {len(args)} {noun}{_bounds(meta, each=True)}"
    else:
        text = meta.get("doc", str(hint))
    if meta.get("note"):
        text += f" ({meta['note']})"
    return text


def _fix_hint(value: object, hint: Any) -> str:
    """A how-to-fix tail for the common wrong-type cases."""
    if isinstance(value, str) and hint in (int, float):
        try:
            float(value)
        except ValueError:
            if re.fullmatch(r"\s*[-+]?[0-9.]+\s*[A-Za-z]+\s*", value):
                return "; write a plain number, the unit is in the key name"
            return ""
        return "; write the number without quotes"
    if hint is bool:
        if isinstance(value, str):
            return "; write true or false without quotes (yes/no/on/off are not accepted)"
        if isinstance(value, (int, float)):
            return "; write true or false"
    if hint is int and isinstance(value, float) and value.is_integer() and abs(value) <= CEILING[int]:
        return f"; write {int(value)}"
    if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"; put it in quotes: '{value}'"
    return ""


CEILING: dict[type, int] = {int: 2**31 - 1, float: 10**9}
"""The upper bound of a number whose field declares none (``le``/``lt``): native code, timeouts
(``Event.wait`` overflows) and buffer sizes must never see an absurd value such as ``1e23``."""


def coerce(value: object, hint: Any, meta: Mapping[str, Any], path: str) -> Any:
    """Check one value against its declared type and bounds; raise Invalid or return the value (ints -> float
    where a float is declared, lists -> tuples)."""
    origin = get_origin(hint)
    wrong_type = Invalid(
        f"expected {expectation(hint, meta)}, got {describe(value)}{_fix_hint(value, hint)}", path
    )
    if origin is tuple:
        args = get_args(hint)
        if not isinstance(value, list) or len(value) != len(args):
            raise wrong_type
        return tuple(
            coerce(v, a, meta, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
        )
    if origin is Literal:
        if not isinstance(value, str):
            raise wrong_type
        if value not in get_args(hint):
            raise Invalid(
                f"expected {expectation(hint, meta)}, got {value!r}{suggest(value, get_args(hint))}", path
            )
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise wrong_type
        return value
    if hint is str:
        if not isinstance(value, str) or not value.strip():
            raise wrong_type
        if meta.get("pattern") and not re.fullmatch(meta["pattern"], value):
            raise Invalid(f"expected {expectation(hint, meta)}, got {value!r}", path)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong_type
        _check_bounds(value, hint, meta, path)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong_type
        number = float(value)
        if not math.isfinite(number):
            raise Invalid(f"expected {expectation(hint, meta)}, got {value!r} (not a finite number)", path)
        _check_bounds(number, hint, meta, path)
        return number
    raise TypeError(f"{path}: no checker for type {hint!r}; give this field a special checker")


def _check_bounds(value: float, hint: Any, meta: Mapping[str, Any], path: str) -> None:
    ge, gt, le, lt, step = (meta.get(k) for k in ("ge", "gt", "le", "lt", "multiple_of"))
    if le is None and lt is None and value > CEILING[hint]:
        raise Invalid(f"expected {expectation(hint, meta)} and at most {CEILING[hint]}, got {value!r}", path)
    inside = (
        (ge is None or value >= ge)
        and (gt is None or value > gt)
        and (le is None or value <= le)
        and (lt is None or value < lt)
        and (not step or value % step == 0)
    )
    if not inside:
        tail = ""
        if step:
            low = ge if ge is not None else step
            high = le if le is not None else max(low, round(value / step) * step)
            tail = f"; nearest valid: {min(max(round(value / step) * step, low), high)}"
        raise Invalid(f"expected {expectation(hint, meta)}, got {value!r}{tail}", path)


def resolve_path(raw: str, base_dir: Path) -> Path:
    """``~`` expanded; relative paths taken from ``base_dir``; ``..`` folded away (symlinks kept)."""
    path = Path(os.path.expanduser(raw))
    if not path.is_absolute():
        path = base_dir / path
    return Path(os.path.normpath(path))


def path_text(value: object, path: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"expected {what}, got {describe(value)}", path)
    return value.strip()


def existing_file(raw: str, path: str, base_dir: Path, what: str = "file") -> Path:
    """The resolved path of ``raw``, which must be an existing file."""
    full = resolve_path(raw, base_dir)
    if not full.exists():
        note = "" if os.path.isabs(os.path.expanduser(raw)) else f" (looked at {full}; {RELATIVE_NOTE})"
        raise Invalid(f"{what} not found: {raw!r}{note}", path)
    if not full.is_file():
        raise Invalid(f"{raw!r} is a folder, not a {what} ({full})", path)
    return full
