"""Checks of command-line values, made as the command line is read or before anything is created:
`--endpoint` URLs (their form, then whether anything listens there) and `--tokenizer` folders.
(The numeric flags' types are `cli.options`'.)"""

from __future__ import annotations

import argparse
import socket
import urllib.parse
from pathlib import Path

from tracetune.errors import InputError

CONNECT_TIMEOUT_S = 3.0
# What a Hugging Face tokenizer folder holds (one of them is enough for AutoTokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def endpoint_url(text: str) -> str:
    """`--endpoint`: an http(s) URL with a host and, if given, a port in 1-65535."""
    fix = "e.g. http://127.0.0.1:8000"
    try:
        parts = urllib.parse.urlsplit(text.strip())
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL ({exc}; {fix})") from None
    if parts.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL ({fix})")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} names no host ({fix})")
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: the port must be a number in 1-65535 ({fix})")
    return text.strip()


def check_listening(url: str, *, flag: str = "--endpoint", timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """An `InputError` (exit 2) unless something accepts a TCP connection at `url`'s host and port,
    within `timeout_s`: a wrong host or port is named at once, not after a minute of health checks."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.gaierror:
        why = f"the host {host!r} is not known"
    except ConnectionRefusedError:
        why = f"nothing is listening on {host}:{port} (connection refused)"
    except TimeoutError:
        why = f"{host}:{port} did not accept a connection within {timeout_s:g}s"
    except OSError as exc:
        why = f"cannot connect to {host}:{port} ({exc.strerror or exc})"
    raise InputError(f"{flag} {url}: {why}; start the server or fix the URL")


def check_tokenizer_dir(path: str | Path, *, flag: str = "--tokenizer") -> Path:
    """`path` as a tokenizer folder, or an `InputError` (exit 2) saying what is wrong with it."""
    folder = Path(path)
    if not folder.exists():
        raise InputError(f"{flag} {folder}: no such folder; name the served model's folder (or its tokenizer's)")
    if not folder.is_dir():
        raise InputError(f"{flag} {folder}: is a file, not a folder; name the folder that holds tokenizer.json")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{flag} {folder}: holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                         f"name the served model's folder")
    return folder
