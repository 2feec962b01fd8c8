"""A search-space file's YAML as written: its node tree (aliases refused), the first key written twice,
the line of a field, and messages made printable. Positions let errors name the line they are about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import yaml


def line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """Line (1-based) of the YAML node at `loc` (pydantic error location), best effort."""
    import yaml

    node, line = root, None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == str(key):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def duplicate_key(node: yaml.Node | None) -> str | None:
    """'key' (lines a and b) of the first mapping key written twice; YAML would keep the last silently."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                line = k.start_mark.line + 1
                if k.value in seen:
                    return f"{line}: key {k.value!r} appears twice (lines {seen[k.value]} and {line}); keep one"
                seen[k.value] = line
            found = duplicate_key(v)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = duplicate_key(item)
            if found:
                return found
    return None


def printable(text: str) -> str:
    """`text` printable on any UTF-8 terminal (YAML escapes can make lone surrogates)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def composed(text: str) -> yaml.Node | None:
    """The YAML node tree of a space file, aliases refused (a YAMLError at the alias): a space is
    short enough to write out, and a few nested aliases (the "billion laughs") expand 600 bytes into
    more values than validation could walk in a lifetime."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, f"alias '*{event.anchor}' refused: write the values "
                                                  f"out (aliases can expand into billions of them)", event.start_mark)
            return super().compose_node(parent, index)

    return yaml.compose(text, Loader=NoAliases)
