"""YAML as qbench reads it (DeepFlow configs, hardware files, --set values): safe tags only, bounded.

A YAML file can make a parser work without end: a "billion laughs" file nests aliases of aliases, so
a few hundred bytes stand for 10**9 values, and anything that walks or prints the value (a check, an
error message) runs out of time or memory. qbench's files are a few kilobytes of plain keys, so the
loader refuses, before building any value:
  - text longer than MAX_BYTES;
  - more than MAX_ALIASES aliases, or an alias of a list or mapping (only a scalar may be repeated);
  - a key given twice in one mapping (YAML would keep the last one silently).
Floats resolve as YAML 1.2 (`37e-6` without a dot is a float, as DeepFlow writes it).
"""

from __future__ import annotations

import re
from typing import Any

MAX_BYTES = 1_000_000  # a DeepFlow config is ~2 KB; a calibration file ~1 KB
MAX_ALIASES = 100
YAML12_FLOAT = re.compile(r"^[-+]?([0-9][0-9_]*)?(\.[0-9_]*)?[eE][-+]?[0-9]+$")


class YamlRefused(ValueError):
    """The text is not YAML qbench reads; the message says why, worded to follow the name of the file."""


def _loader():
    import yaml

    class Loader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise YamlRefused(f"has more than {MAX_ALIASES} aliases (line {event.start_mark.line + 1})")
                node = self.anchors.get(event.anchor)
                if node is not None and not isinstance(node, yaml.ScalarNode):
                    raise YamlRefused(f"has an alias *{event.anchor} of a list or mapping (line "
                                      f"{event.start_mark.line + 1}); write the values out")
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key in seen:
                    raise YamlRefused(f"gives the key {key[:60]!r} twice (line {key_node.start_mark.line + 1})")
                seen.add(key)
            return super().construct_mapping(node, deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))
    return Loader


def load(text: str) -> Any:
    """The value of a YAML text within the limits above; YamlRefused with the reason otherwise."""
    import yaml

    if len(text) > MAX_BYTES:
        raise YamlRefused(f"is {len(text)} characters long; qbench reads YAML of at most {MAX_BYTES}")
    try:
        return yaml.load(text, Loader=_loader())
    except yaml.YAMLError as exc:
        raise YamlRefused(f"is not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise YamlRefused("is nested too deeply") from None
