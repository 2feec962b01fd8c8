"""The one secret policy: what counts as a credential (API keys, tokens, passwords), the values the tuner
must never store (`secret_values`, scrubbed by a `Redactor`), the settings an export leaves out
(`is_secret`, `strip_secret_args`), and a URL shown without its password (`display_url`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TypeVar, cast

# Words of a setting's name that make it a credential: HF_TOKEN and --api-key are, --max-num-batched-tokens
# and --tokenizer are not (a word, not a substring).
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pgpassword", "pass", "pwd",
                          "credential", "credentials", "auth", "authorization", "cookie", "bearer"})
# Values shaped like an API token, whatever their setting is called.
_SECRET_VALUE = re.compile(r"(?i)^(bearer\s|sk-[a-z0-9_-]{8,}|hf_[a-z0-9]{8,}|gh[pousr]_[a-z0-9]{8,}|"
                           r"xox[abpr]-[a-z0-9-]{8,}|eyJ[a-z0-9_-]{10,}\.)")
# Shorter values ("1", "true") are flags, not secrets, and scrubbing them would mangle every text.
_MIN_SECRET_LEN = 6
TOKEN_SHAPED_ARG = "(a token-shaped argument)"


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def secret_shaped(value: str | None) -> bool:
    """The value looks like an API token (sk-..., hf_..., a bearer header, a JWT, ...)."""
    return value is not None and bool(_SECRET_VALUE.match(value.strip()))


def is_secret(name: str, value: str | None = None) -> bool:
    """A setting (environment variable or flag, without its dashes) that holds a credential: a word of
    its name says so, or its value is shaped like a token."""
    return bool(set(_words(name)) & SECRET_WORDS) or secret_shaped(value)


def _credential_env(name: str, value: str) -> bool:
    """In the environment tracetune itself runs in, only names that end like a credential (HF_TOKEN,
    OPENAI_API_KEY, PGPASSWORD, ...), never paths: a broader match would mask ordinary text."""
    words = _words(name)
    return bool(words) and words[-1] in SECRET_WORDS and not value.startswith("/")


def _secret_args(args: list[str]) -> Iterator[tuple[int, int, str, str | None]]:
    """(position, how many arguments, name to show, secret value) of each credential in an argument
    list: a flag named like one with its value (`--api-key K`, `--hf-token=T`), or a token-shaped argument."""
    i = 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        takes_next = flag.startswith("-") and not eq and i + 1 < len(args) and not args[i + 1].startswith("-")
        value = inline if eq else (args[i + 1] if takes_next else None)
        span = 1
        if flag.startswith("-") and is_secret(flag.lstrip("-"), value):
            span = 2 if takes_next else 1
            yield i, span, flag, value
        elif secret_shaped(args[i]):
            yield i, 1, TOKEN_SHAPED_ARG, args[i]
        i += span


def strip_secret_args(args: list[str], dropped: list[str]) -> list[str]:
    """`args` without its credentials; the name of each one left out is appended to `dropped`."""
    spans = {i: (n, name) for i, n, name, _ in _secret_args(args)}
    out, i = [], 0
    while i < len(args):
        if i in spans:
            n, name = spans[i]
            dropped.append(name)
            i += n
            continue
        out.append(args[i])
        i += 1
    return out


def _url_password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        password = make_url(url).password
    except Exception:
        return None
    return str(password) if password else None


def secret_values(*, env: dict[str, str] | None = None, process_env: dict[str, str] | None = None,
                  args: Iterable[str] = (), urls: Iterable[str] = (), extra: Iterable[str] = ()) -> list[str]:
    """Values that must never be stored: the engine's environment variables and arguments that are
    credentials (`is_secret`), credentials in the tuner's own environment, URL passwords, and
    `extra`; longest first (a `Redactor` replaces the longest match)."""
    found = [v for v in extra if v]
    found += [value for name, value in (env or {}).items() if is_secret(name, value)]
    found += [value for name, value in (process_env or {}).items() if _credential_env(name, value)]
    found += [value for _, _, _, value in _secret_args(list(args)) if value]
    found += [p for p in map(_url_password, urls) if p]
    return sorted({v for v in found if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)


_T = TypeVar("_T")


class Redactor:
    """Replaces every known secret value with *** in strings, lists and dicts."""

    MASK = "***"

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, value: _T) -> _T:
        """`value` with every secret masked (strings, and the strings inside lists, tuples and dicts)."""
        if not self.secrets or value is None:
            return value
        if isinstance(value, str):
            text: str = value
            for secret in self.secrets:
                if secret in text:
                    text = text.replace(secret, self.MASK)
            return cast(_T, text)
        if isinstance(value, dict):
            return cast(_T, {self(k): self(v) for k, v in value.items()})
        if isinstance(value, (list, tuple)):
            return cast(_T, type(value)(self(v) for v in value))
        return value


def display_url(url: str) -> str:
    """The URL with its password replaced by ***, for printing."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy understands: show nothing that could be a secret
        return re.sub(r"//[^@/]*@", "//***@", url)
