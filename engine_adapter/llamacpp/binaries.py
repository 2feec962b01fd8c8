"""Where llama.cpp's server and tools are: the build scripts/install_llamacpp.sh made and cached.

That script compiles llama.cpp (from the llama-cpp-python source distribution, pinned) once per
machine and keeps it under `~/.cache/tracetune/llama.cpp/<version>-<key>/` (the key: a hash of the
version, the architecture, the CPU's vector features and the compiler), writing `SOURCE` last, so a
directory with `SOURCE` is a complete build. `TRACETUNE_LLAMACPP_DIR` names a build explicitly.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path

from tracetune.errors import InputError

# The llama-cpp-python release whose vendored llama.cpp scripts/install_llamacpp.sh builds.
LLAMACPP_PYTHON_VERSION = "0.3.36"
# The official server image built from the llama.cpp commit vendored in it (llama.cpp b11312 is commit
# 0c1e57098bba43ac29e6e3b677cdceebdd22334f; images are tagged server-b<N>).
SERVER_IMAGE_TAG = "server-b11312"
INSTALL_HINT = "run bash scripts/install_llamacpp.sh (about 11-17 min of compiling, once)"
TOOLS = ("llama-server", "llama-quantize")
_FLAGS = re.compile(r"\b(avx|avx2|avx512[a-z_0-9]*|amx[a-z_0-9]*|fma|f16c|bmi2|sse4_2|asimd|sve|i8mm)\b")


def cache_root() -> Path:
    """The folder scripts/install_llamacpp.sh caches builds in."""
    explicit = os.environ.get("TRACETUNE_LLAMACPP_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracetune" / "llama.cpp"


def machine_key() -> str:
    """The cache key scripts/install_llamacpp.sh computes for this machine (see its `cpu_key`)."""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                found = _FLAGS.findall(line)
                if found:
                    flags = sorted(set(found))
                    break
    except OSError:
        pass
    try:
        compiler = subprocess.run(["c++", "--version"], capture_output=True, text=True,
                                  timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        compiler = "none"
    text = f"{LLAMACPP_PYTHON_VERSION}|{platform.machine()}|{''.join(f + ' ' for f in flags)}|{compiler}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _complete(directory: Path) -> bool:
    return (directory / "SOURCE").is_file() and all((directory / "bin" / tool).is_file() for tool in TOOLS)


@functools.cache
def llamacpp_dir() -> Path:
    """The llama.cpp build to run: `TRACETUNE_LLAMACPP_DIR`, else the cached build made for this
    machine, else the newest complete cached build. InputError when there is none."""
    explicit = os.environ.get("TRACETUNE_LLAMACPP_DIR")
    if explicit:
        path = Path(explicit).expanduser()
        if not _complete(path):
            raise InputError(f"TRACETUNE_LLAMACPP_DIR={explicit} holds no complete llama.cpp build "
                             f"(SOURCE, bin/{', bin/'.join(TOOLS)}); {INSTALL_HINT}")
        return path.resolve()
    root = cache_root()
    builds = [d for d in root.glob(f"{LLAMACPP_PYTHON_VERSION}-*") if _complete(d)] if root.is_dir() else []
    if not builds:
        raise InputError(f"llama.cpp is not built on this machine (nothing in {root}): {INSTALL_HINT}")
    mine = root / f"{LLAMACPP_PYTHON_VERSION}-{machine_key()}"
    if mine in builds:
        return mine.resolve()
    return max(builds, key=lambda d: (d / "SOURCE").stat().st_mtime).resolve()


def tool(name: str) -> Path:
    """The path of one llama.cpp program (llama-server, llama-quantize, ...)."""
    return llamacpp_dir() / "bin" / name


def build_label() -> str:
    """Which build runs (its cache folder's name), for cache keys and logs."""
    return llamacpp_dir().name


def unavailable() -> str | None:
    """Why llama.cpp cannot run on this machine (its build is missing, with how to make it), or None."""
    try:
        llamacpp_dir()
    except InputError as exc:
        return str(exc)
    return None
