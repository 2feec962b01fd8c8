"""Writing an export's text safely: `#` comments that stay one line and `$` as compose and Kubernetes
read it (`tracetune.k8s`), and YAML people read (written by its library, so any value round-trips
exactly; ASCII with escapes, as exports have always been written)."""

from __future__ import annotations

from collections.abc import Sequence

from tracetune.k8s import comment_safe, dollars

__all__ = ["comment_safe", "dollars", "yaml_text"]


def yaml_text(docs: Sequence[object]) -> str:
    """`docs` as YAML documents separated by `---`, keys in their order, no anchors, one line per value."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:  # no &id001 anchors: people read these files
            return True

    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False, allow_unicode=False, width=1 << 16)
                         for d in docs)
