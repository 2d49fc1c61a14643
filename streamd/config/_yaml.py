"""YAML text -> (plain data, key path -> line number, duplicate-key problems).

The loader is PyYAML's safe loader with YAML 1.2 scalars: only ``true``/``false`` are booleans (``yes``,
``no``, ``on``, ``off`` stay strings, so the config check can reject them), and ``1e-3`` is a number,
not a string.
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from streamd.config.errors import ConfigError

_BOOL = "tag:yaml.org,2002:bool"
_FLOAT = "tag:yaml.org,2002:float"


class _StrictLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 booleans and floats (see module docstring)."""


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_StrictLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
            |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str, label: str) -> tuple[object, dict[str, int], list[tuple[str, str]]]:
    """Parse one YAML document. Returns the data, a map from key path (``streams[0].url``) to its
    1-based line, and (path, message) problems for keys given twice. Raises ConfigError on a syntax error."""
    loader = _StrictLoader(text)
    marks: dict[str, int] = {}
    duplicates: list[tuple[str, str]] = []
    try:
        node = loader.get_single_node()
        if node is not None:  # before constructing: that folds merged (<<) keys into the nodes
            marks[""] = node.start_mark.line + 1
            _walk(node, "", marks, duplicates, set())
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([_syntax_problem(label, exc)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{label}: invalid YAML: {exc}"]) from None
    finally:
        loader.dispose()
    return data, marks, duplicates


def _syntax_problem(label: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark is not None else label
    text = f"{where}: invalid YAML: {exc.problem or exc.context}"
    if exc.context and exc.problem and exc.context_mark is not None:
        text += f" ({exc.context} started on line {exc.context_mark.line + 1})"
    if exc.problem and "'\\t'" in exc.problem:
        text += "; indent with spaces, not tabs"
    return text


def _walk(
    node: Node, path: str, marks: dict[str, int], duplicates: list[tuple[str, str]], seen: set[int]
) -> None:
    """Map key paths to lines. Each node is walked once: an alias (``*anchor``) repeats a node already walked,
    and its keys keep the lines of the anchor's copy, so the walk is as long as the file, never as long as
    the document with every alias expanded (nested aliases grow that exponentially)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.value == "<<":
                continue  # merged keys (<<: *anchor) take the line of their mapping
            key, line = key_node.value, key_node.start_mark.line + 1
            child = f"{path}.{key}" if path else key
            if key in lines:
                duplicates.append(
                    (
                        child,
                        f"key given twice (first on line {lines[key]}); YAML keeps only the last, delete one",
                    )
                )
            lines[key] = line
            marks[child] = line
            _walk(value_node, child, marks, duplicates, seen)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            child = f"{path}[{index}]"
            marks[child] = item.start_mark.line + 1
            _walk(item, child, marks, duplicates, seen)
