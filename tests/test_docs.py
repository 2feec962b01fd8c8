"""The documentation stays usable: a short README, links that resolve, every command listed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_BYTES = 12_000

# [text](target) and [text](target "title"); images too
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def doc_files() -> list[Path]:
    return [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(markdown: str) -> list[str]:
    """Link targets outside code blocks that point into this tree (not URLs, not bare #anchors)."""
    text = FENCE.sub("", markdown)
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        targets.append(target)
    return targets


def tune_commands() -> list[str]:
    """The COMMAND choices `tune --help` lists, read from its own error for an unknown command."""
    result = subprocess.run([sys.executable, "-m", "tracetune", "no-such-command"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    found = re.search(r"choose from (.*?)\)", result.stderr)
    assert found, result.stderr
    return re.findall(r"'([^']+)'", found.group(1))


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size:,} bytes; keep it within {README_MAX_BYTES:,}: the manual belongs in docs/")


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    assert path.exists(), path
    broken = []
    for target in relative_links(path.read_text(encoding="utf-8")):
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).resolve().exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files: {broken}"


def test_relative_links_parser():
    text = "[a](docs/x.md#y) ![i](img.png) [u](https://e.org/z) [h](#top)\n```\n[c](not/a/link.md)\n```\n"
    assert relative_links(text) == ["docs/x.md#y", "img.png"]


def test_readme_command_table_names_every_command():
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Commands\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README.md has no '## Commands' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")]
    commands = tune_commands()
    assert "capacity" in commands and "dashboard" in commands  # the parse found the real list
    missing = [name for name in commands if not any(f"`tune {name}" in row for row in rows)]
    assert not missing, f"README.md's command table lacks: {missing}"
    assert any("`tune --trace" in row for row in rows), "the main job is missing from the command table"
