"""Kubernetes as tracetune writes it for any package: the names and quantities the API accepts, GPU
placement as NVIDIA's GPU operator labels and taints nodes, `$` as Kubernetes expands it, and YAML
people read. The fleet manifests (`tracetune.fleet`) and the exports (`dashboard.export`) use these (the
exports write their YAML as they always have, ASCII with escapes: `dashboard.export.text`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

# A DNS-1123 label (names of Jobs, ConfigMaps, Secrets, claims) and a resource quantity (4, 500m, 16Gi).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")

# Where a GPU pod may run: the taint and label NVIDIA's GPU operator sets (adjust to your cluster's).
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
GPU_RESOURCE = "nvidia.com/gpu"


# What a server asks per GPU (one without GPUs asks as for one): an export's replica, a fleet worker's engine.
SERVER_CORES_PER_GPU = 4
SERVER_MEMORY_GIB_PER_GPU = 16


def check_quantity(flag: str, quantity: str | None) -> None:
    """A resource flag's value is a Kubernetes quantity (None: not given); an InputError otherwise."""
    from tracetune.errors import InputError

    if quantity is not None and not QUANTITY.match(quantity):
        raise InputError(f"{flag} {quantity!r} is not a Kubernetes quantity; write e.g. 4, 500m, 16Gi")


def k8s_name(text: str, limit: int = 63) -> str:
    """A DNS-1123 label made from any text (lowercase, [a-z0-9-], at most `limit` characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    return name or "tracetune"


def dollars(text: str) -> str:
    """Kubernetes expands `$(VAR)` in a container's command, args and env values; `$$` is its literal `$`."""
    return text.replace("$", "$$")


def yaml_text(docs: Sequence[object]) -> str:
    """`docs` as YAML documents separated by `---`, keys in their order, no anchors, one line per value
    except text of several lines (a trace in a ConfigMap), written as a block people can read."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:  # no &id001 anchors: people read these files
            return True

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None  # PyYAML falls back to quotes where a block cannot hold it
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
                         for d in docs)


def comment_safe(text: object) -> str:
    """Text that stays inside one `#` comment line (control characters, newlines included, removed)."""
    return re.sub(r"[\x00-\x1f\x7f\u2028\u2029\x85]+", " ", str(text))
