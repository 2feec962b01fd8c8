"""Writing an export's text safely: `#` comments that stay one line, `$` as compose and Kubernetes
read it, and YAML people read (written by its library, so any value round-trips exactly)."""

from __future__ import annotations

import re
from collections.abc import Sequence


def comment_safe(text: object) -> str:
    """Text that stays inside one `#` comment line (control characters, newlines included, removed)."""
    return re.sub(r"[\x00-\x1f\x7f\u2028\u2029\x85]+", " ", str(text))


def dollars(text: str) -> str:
    """compose and Kubernetes expand `$VAR`/`$(VAR)`; `$$` is their literal `$`."""
    return text.replace("$", "$$")


def yaml_text(docs: Sequence[object]) -> str:
    """`docs` as YAML documents separated by `---`, keys in their order, no anchors, one line per value."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:  # no &id001 anchors: people read these files
            return True

    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False, allow_unicode=False, width=1 << 16)
                         for d in docs)
