#!/usr/bin/env bash
# Type check (mypy) the whole `tracetune` package; config in pyproject.toml's [tool.mypy].
#
# The package's folders are mapped by pyproject's [tool.setuptools.package-dir] (tracetune.cli
# lives in cli/, ...), which mypy cannot follow, so this builds build/typecheck/: a tree of
# symlinks laid out as the imports read (tracetune/cli -> cli/, ...), runs `mypy -p tracetune`
# there, and prints each error with its real source path (cli/tune.py).
#
# Usage: bash scripts/typecheck.sh [PATH...]   PATHs (files or folders) restrict the report;
# the whole package is always checked. Exit status 0 when no error is reported.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$@" <<'PY'
import fcntl, os, pathlib, re, shutil, subprocess, sys, tomllib

root = pathlib.Path.cwd()
tree = root / "build" / "typecheck"
dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

# One run at a time: several people share this tree (and mypy's cache); a second run waits here.
(root / "build").mkdir(exist_ok=True)
lock = open(root / "build" / "typecheck.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)

# The tree: the top package's own files linked one by one (its folder is a real folder here, so
# that its subpackages can sit inside it); every other mapped package is one link to its folder.
shutil.rmtree(tree, ignore_errors=True)
top = tree / "tracetune"
top.mkdir(parents=True)
for f in (root / dirs["tracetune"]).iterdir():
    if f.suffix in (".py", ".pyi") or f.name == "py.typed" or (f / "__init__.py").is_file():
        (top / f.name).symlink_to(os.path.relpath(f, top))
real = {"tracetune/": dirs["tracetune"].rstrip("/") + "/"}  # tree prefix -> source prefix
for name, folder in sorted(dirs.items()):
    if name == "tracetune":
        continue
    link = tree / name.replace(".", "/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(root / folder, link.parent))
    real[name.replace(".", "/") + "/"] = folder.rstrip("/") + "/"


def source_path(path: str) -> str:
    """The path in the source tree of a file named by its place in build/typecheck/."""
    for prefix in sorted(real, key=len, reverse=True):
        if path.startswith(prefix):
            return real[prefix] + path[len(prefix):]
    return path


cmd = [sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"),
       "--cache-dir", str(root / "build" / "mypy_cache"), "-p", "tracetune"]
proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
only = [os.path.normpath(p) for p in sys.argv[1:]]
line_re = re.compile(r"^(?P<path>[^:\s]+\.pyi?)(?P<rest>:.*)$")
errors, files, elsewhere = 0, set(), 0
for line in proc.stdout.splitlines():
    m = line_re.match(line)
    if not m:
        if not line.startswith(("Found ", "Success: ")):
            print(line)
        continue
    path = source_path(m["path"])
    if only and not any(path == p or path.startswith(p.rstrip("/") + "/") for p in only):
        elsewhere += ": error:" in m["rest"]
        continue
    print(path + m["rest"])
    if ": error:" in m["rest"]:
        errors += 1
        files.add(path)
sys.stderr.write(proc.stderr)
if proc.returncode not in (0, 1):  # 2: mypy itself failed (bad config, crash, a syntax error)
    sys.exit(proc.returncode)
if proc.returncode == 1 and not errors and not only:  # errors in a form not read above (printed as is)
    sys.exit(1)
scope = (" in " + " ".join(only) + f" ({elsewhere} elsewhere)") if only else ""
if errors:
    print(f"typecheck: {errors} error{'s' * (errors != 1)} in {len(files)} file{'s' * (len(files) != 1)}{scope}")
    sys.exit(1)
print(f"typecheck: no errors{scope}")
PY
