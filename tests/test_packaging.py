"""What `pip install .` puts into site-packages: one package, `tracetune`, with every subpackage
and data file the code reads (the source tree's folders mapped under it by pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wheel(tmp_path: Path) -> tuple[zipfile.ZipFile, Path]:
    """The wheel pip builds from a copy of the checkout's tracked files (no build outputs), and
    that copy."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((ROOT / name).read_bytes())
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return zipfile.ZipFile(next((tmp_path / "dist").glob("tracetune-*.whl"))), src


def test_the_wheel_installs_only_tracetune(tmp_path):
    wheel, src = _wheel(tmp_path)
    names = wheel.namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"tracetune"}, sorted(top)
    mapped = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in mapped.items():
        sources = {p.relative_to(src / folder).as_posix() for p in (src / folder).rglob("*.py")}
        packaged = {n.removeprefix(package.replace(".", "/") + "/") for n in names
                    if n.startswith(package.replace(".", "/") + "/") and n.endswith(".py")}
        assert sources <= packaged, (package, sorted(sources - packaged))
    assert "tracetune/search_spaces/default.yaml" in names
    assert any(n.startswith("tracetune/replay/data/") and n.endswith(".txt") for n in names)
