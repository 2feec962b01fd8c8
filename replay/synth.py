"""Prompts of exact token lengths, synthesised from real text, with prefix sharing on purpose.

Length-only traces (Mooncake, Azure, BurstGPT) record how many tokens a request had, not what
they were. `PromptSynthesizer` turns a length (and, for Mooncake, the prefix block ids) into
real English text of exactly that many tokens under the target model's tokenizer:

- text comes from a corpus of real prompts (500 ShareGPT prompts shipped in replay/data by
  default), concatenated into one long token stream;
- each block id maps to a fixed window of that stream, so two requests whose `hash_ids` start
  the same get byte-identical text prefixes, and a prefix cache sees exactly the reuse the trace
  recorded; requests without hash ids get windows at distinct offsets, so they share nothing;
- the last block is trimmed or extended until the whole prompt re-tokenises to exactly the
  requested count (BPE merges at block seams can shift it by a token or two).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tracetune.errors import InputError

CORPUS_FILE = Path(__file__).resolve().parent / "data" / "corpus_sharegpt_500.txt"


def load_corpus_text(path: Path | None = None) -> str:
    """Real text to synthesise from: a ShareGPT JSON file's prompts, or a plain text file."""
    path = path or CORPUS_FILE
    if not path.is_file():
        raise InputError(f"corpus file {path} does not exist")
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return "\n\n".join(turn["value"] for conv in data for turn in conv.get("conversations", [])[:1])
    return path.read_text(encoding="utf-8")


class Tokenizer(Protocol):
    """What a prompt needs of a tokenizer (a Hugging Face tokenizer meets it)."""

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], /) -> str: ...


def _stable_int(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class PromptSynthesizer:
    """Build prompts of exact token counts from real text with a given tokenizer."""

    def __init__(self, tokenizer: Tokenizer, corpus_text: str | None = None, *, block_tokens: int = 512, seed: int = 0):
        self.tokenizer = tokenizer
        self.block_tokens = block_tokens
        self.seed = seed
        text = corpus_text if corpus_text is not None else load_corpus_text()
        self.stream: list[int] = tokenizer.encode(text, add_special_tokens=False)
        if len(self.stream) < 4 * block_tokens:
            raise InputError(f"the corpus has only {len(self.stream)} tokens; need at least {4 * block_tokens}")
        self.special = len(tokenizer.encode("", add_special_tokens=True))
        self._block_cache: dict[tuple[int, int], str] = {}

    def count(self, text: str) -> int:
        """Tokens the server will count for `text` as a completion prompt."""
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def _window(self, key: int, n_tokens: int) -> str:
        """Decoded text of `n_tokens` tokens of the corpus stream at a position fixed by `key`."""
        cached = self._block_cache.get((key, n_tokens))
        if cached is not None:
            return cached
        span = len(self.stream) - n_tokens
        start = _stable_int(self.seed, key) % max(span, 1)
        text = self.tokenizer.decode(self.stream[start:start + n_tokens])
        self._block_cache[(key, n_tokens)] = text
        return text

    def _fit_tail(self, head: str, tail_key: int, want: int) -> str:
        """head + a tail window sized so the whole text has exactly `want` tokens.

        BPE merges across the seam can shift the count by a token or two, so the tail length is
        corrected a few times, then nearby lengths and other tail windows are tried (bounded).
        """
        base = max(want - self.count(head), 1)
        for attempt in range(8):
            key = _stable_int(tail_key, attempt)
            n = base
            tried: set[int] = set()
            for _ in range(6):
                if n < 1 or n in tried:
                    break
                tried.add(n)
                text = head + self._tail(key, n)
                got = self.count(text)
                if got == want:
                    return text
                n += want - got
            for n in range(max(base - 4, 1), base + 5):
                if n not in tried:
                    text = head + self._tail(key, n)
                    if self.count(text) == want:
                        return text
        raise InputError(f"could not synthesise a prompt of exactly {want} tokens from the corpus")

    def _tail(self, key: int, n: int) -> str:
        start = key % max(len(self.stream) - n, 1)
        return self.tokenizer.decode(self.stream[start:start + n])

    def prompt(self, input_length: int, *, hash_ids: Sequence[int] | None = None, unique_key: object = None) -> str:
        """A prompt of exactly `input_length` tokens.

        With `hash_ids`, full blocks of `block_tokens` are taken per id (shared ids -> shared text);
        the final, partial block is fitted to the exact length. Without, the text is unique to
        `unique_key` (e.g. the request's line number).
        """
        if input_length <= self.special:
            raise InputError(f"input_length {input_length} is too short (the tokenizer adds {self.special} tokens)")
        if not hash_ids:
            return self._fit_tail("", _stable_int("unique", unique_key), input_length)
        full_blocks = min(len(hash_ids) - 1, (input_length - self.special) // self.block_tokens)
        head = "".join(self._window(_stable_int("block", h), self.block_tokens) for h in hash_ids[:full_blocks])
        if self.count(head) >= input_length:
            full_blocks -= 1
            head = "".join(self._window(_stable_int("block", h), self.block_tokens) for h in hash_ids[:full_blocks])
        tail_key = _stable_int("tail", tuple(hash_ids), unique_key)
        return self._fit_tail(head, tail_key, input_length)


def prefix_reuse_ratio(token_lists: Sequence[Sequence[int]], block_tokens: int) -> float:
    """Share of all prompt tokens in full blocks whose whole prefix appeared in an earlier prompt.

    This is what an infinite prefix cache with `block_tokens`-token blocks would hit.
    """
    seen: set[int] = set()
    hit = total = 0
    for tokens in token_lists:
        total += len(tokens)
        chained = 0
        for b in range(len(tokens) // block_tokens):
            block = tuple(tokens[b * block_tokens:(b + 1) * block_tokens])
            chained = hash((chained, block))
            if chained in seen:
                hit += block_tokens
            else:
                seen.add(chained)
    return hit / total if total else 0.0


def implied_reuse_ratio(records: Sequence[tuple[int, Sequence[int]]], block_tokens: int) -> float:
    """The reuse a Mooncake-style trace implies: tokens in blocks whose id chain was seen before.

    `records` are (input_length, hash_ids); a block counts only when all ids up to it repeat a
    prefix seen earlier (ids identify prefix blocks, so this is the infinite-cache hit share).
    """
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for input_length, hash_ids in records:
        total += input_length
        for i in range(len(hash_ids)):
            prefix = tuple(hash_ids[: i + 1])
            size = min(block_tokens, input_length - i * block_tokens)
            if prefix in seen:
                hit += max(size, 0)
            else:
                seen.add(prefix)
    return hit / total if total else 0.0
