"""Reading config YAML (files and override values) so that no input can hang, crash or be misread.

PyYAML alone accepts inputs that go wrong in ways a user never sees coming, so every YAML text is read here:

- **bounds**: at most :data:`MAX_YAML_BYTES` of text, :data:`MAX_YAML_DEPTH` nested collections (the composer
  recurses per level; 20,000 levels end in ``RecursionError``) and :data:`MAX_YAML_NODES` values once aliases are
  expanded (a "billion laughs" alias bomb is a few lines that expand to millions of values, and validation and
  ``config.yaml`` copy every one). Depth and expansion are measured on the event stream, before any node is built;
- **duplicate keys**: two ``run:`` blocks, or one key twice in any mapping, are refused (YAML keeps the last one
  silently);
- **YAML 1.1 numbers**: ``1:30`` (base 60, read as 90), ``010`` (octal, read as 8) and integers longer than
  :data:`MAX_INT_DIGITS` digits (Python refuses to convert 4,301 digits) are refused with the key and the line.

Every problem found is a :class:`ConfigIssue` naming the dotted key; they come together in one
:class:`YamlInputError`. Syntax errors stay ``yaml.YAMLError`` (the caller words them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from groupwise.config.issues import ConfigIssue

MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000
MAX_INT_DIGITS = 100

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_LEGACY_OCTAL = re.compile(r"^[-+]?0[0-7_]+$")


class ConfigYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-4`` as a float. Plain YAML 1.1 needs a dot (``1.0e-4``) and
    would otherwise hand a learning rate over as the string ``"1e-4"``."""


ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class YamlInputError(ValueError):
    """YAML that parses but must not be used: every problem, each naming its dotted key."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(f"{issue.path or '(config file)'}: {issue.rule}" for issue in issues))


def parse_yaml(text: str, prefix: str = "") -> Any:  # Any: the parsed YAML document (JSON-like)
    """``text`` parsed as YAML with :class:`ConfigYamlLoader` (safe: plain data only), within the bounds above.

    ``prefix`` is the dotted key the text is the value of (an override's key; ``""`` for a whole file), used in
    the issues. Raises :class:`YamlInputError` for bounds, duplicate keys and YAML 1.1 numbers, and
    ``yaml.YAMLError`` for syntax errors.
    """
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise YamlInputError([ConfigIssue(
            prefix, f"{size:,} bytes of YAML", f"config YAML is limited to {MAX_YAML_BYTES:,} bytes",
            "keep large data (word lists, prompts) in a file your reward function or dataset reads",
        )])
    _check_structure(text, prefix)
    loader = ConfigYamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        issues = _node_issues(loader, node, prefix)
        if issues:
            raise YamlInputError(issues)
        return loader.construct_document(node)
    finally:
        loader.dispose()


@dataclass
class _OpenCollection:
    """A list or mapping being read: its anchor, and how many values it holds so far with aliases expanded."""

    anchor: str | None
    size: int


def _check_structure(text: str, prefix: str) -> None:
    """Refuse nesting deeper than :data:`MAX_YAML_DEPTH` and more than :data:`MAX_YAML_NODES` values after alias
    expansion, reading only the event stream (the parser keeps its own stack, so this never recurses)."""
    depth = 0
    total = 0
    anchored_sizes: dict[str, int] = {}
    open_collections: list[_OpenCollection] = []
    for event in yaml.parse(text, Loader=ConfigYamlLoader):
        added = 0
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise YamlInputError([ConfigIssue(
                    prefix, f"more than {MAX_YAML_DEPTH} nested levels (line {_line(event)})",
                    f"config YAML may nest lists and mappings at most {MAX_YAML_DEPTH} levels deep",
                    "flatten the value; no setting needs deeper nesting",
                )])
            open_collections.append(_OpenCollection(event.anchor, 1))
            added = 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            closed = open_collections.pop()
            if closed.anchor:
                anchored_sizes[closed.anchor] = closed.size
            if open_collections:
                open_collections[-1].size += closed.size
            continue
        elif isinstance(event, yaml.ScalarEvent):
            added = 1
            if event.anchor:
                anchored_sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent) and event.anchor is not None:
            added = anchored_sizes.get(event.anchor, 1)
        if open_collections:
            open_collections[-1].size += added
        total += added
        if total > MAX_YAML_NODES:
            raise YamlInputError([ConfigIssue(
                prefix, f"more than {MAX_YAML_NODES:,} values once aliases are expanded",
                f"config YAML may hold at most {MAX_YAML_NODES:,} values, counting each use of an alias (*name) as a "
                "full copy of its anchor",
                "remove the repeated aliases (an alias of an alias multiplies the size at every level)",
            )])


def _node_issues(loader: yaml.SafeLoader, root: yaml.Node, prefix: str) -> list[ConfigIssue]:
    """Duplicate keys and YAML 1.1 number surprises anywhere under ``root``, in line order.

    The walk keeps its own stack and visits an aliased node once (its first path is the one reported).
    """
    found: list[tuple[int, ConfigIssue]] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, prefix)]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    stack.append((value_node, path))
                    continue
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                child = f"{path}.{key}" if path else str(key)
                line = key_node.start_mark.line + 1
                if isinstance(key_node, yaml.ScalarNode):
                    ident = (key_node.tag, key_node.value)
                    if ident in first_line:
                        found.append((line, ConfigIssue(
                            child, f"2 entries (lines {first_line[ident]} and {line})",
                            f"the key '{key}' is given twice in one mapping; YAML would silently keep the last one",
                            f"keep one '{key}:' entry (merge the two blocks into one)",
                        )))
                    else:
                        first_line[ident] = line
                stack.append((value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.ScalarNode) and node.style is None:
            issue = _number_issue(loader, node, path)
            if issue is not None:
                found.append((node.start_mark.line + 1, issue))
    return [issue for _, issue in sorted(found, key=lambda pair: pair[0])]


def _number_issue(loader: yaml.SafeLoader, node: yaml.ScalarNode, path: str) -> ConfigIssue | None:
    """The problem with a plain scalar YAML 1.1 reads as a number the user most likely did not mean."""
    text = node.value
    line = node.start_mark.line + 1
    if node.tag not in (_INT_TAG, _FLOAT_TAG):
        return None
    if ":" in text:
        value = loader.construct_object(node)
        return ConfigIssue(
            path, text, f"YAML 1.1 reads {text} as the base-60 number {value} (line {line})",
            f"write the number you mean (e.g. {value}), or quote the text: '{text}'",
        )
    if node.tag != _INT_TAG:
        return None
    digits = sum(ch.isdigit() for ch in text)
    if digits > MAX_INT_DIGITS:
        return ConfigIssue(
            path, f"{text[:12]}... ({digits} digits)",
            f"integers in a config are limited to {MAX_INT_DIGITS} digits (line {line})", "use a smaller number",
        )
    if _LEGACY_OCTAL.match(text):
        value = loader.construct_object(node)
        decimal = int(text.replace("_", ""), 10)
        if value != decimal:
            return ConfigIssue(
                path, text, f"YAML 1.1 reads {text} (a leading zero) as the octal number {value}, not {decimal} "
                f"(line {line})", f"write {decimal} without the leading zero, or quote the text: '{text}'",
            )
    return None


def _line(event: yaml.Event) -> int | str:
    """The 1-based line an event starts on (``?`` when the parser gave no position)."""
    return event.start_mark.line + 1 if event.start_mark is not None else "?"
