"""The worker image: the engine's own image (`EngineKind.image`, tagged with the release tracetune runs)
with tracetune installed beside the engine, written as a Dockerfile next to the manifests. A worker
runs whole trials inside it (the server, the replay client, the quality probe, the checkpoints
tracetune makes), so the image must hold everything a trial runs (`Deployment.runs_trials`); for
any other engine the user names the image to start from."""

from __future__ import annotations

from pathlib import Path

from tracetune.engine_adapter.kind import EngineKind
from tracetune.errors import InputError

WORKER_REPOSITORY = "tracetune-worker"
DOCKERFILE = "Dockerfile"
# BuildKit reads `<Dockerfile>.dockerignore` beside the Dockerfile before the context's own .dockerignore.
DOCKERIGNORE = "Dockerfile.dockerignore"


def engine_image(engine: EngineKind) -> str | None:
    """The engine's image tagged with the release tracetune runs, or None when it has none."""
    deployment = engine.deployment
    if engine.image is None or engine.image_version is None or deployment is None:
        return None
    return f"{engine.image}:{deployment.tag.format(version=engine.image_version)}"


def base_image(engine: EngineKind, given: str | None) -> str:
    """What the worker image is built FROM: --base-image, else the engine's image where it holds
    everything a trial runs; an InputError saying what to give otherwise."""
    if given:
        return given
    image = engine_image(engine)
    if image is not None and engine.deployment is not None and engine.deployment.runs_trials:
        return image
    why = (f"its image {image} holds the server but not everything a trial runs (the tools that make the "
           f"files it serves)") if image else "it names no container image"
    raise InputError(f"--engine {engine.name}: {why}; give --base-image IMAGE, one with Python >= 3.11 and "
                     f"the {engine.shown} engine tracetune starts (e.g. python:3.11-slim for --engine sim)")


def worker_image(engine: EngineKind, base: str, version: str) -> str:
    """The default name of the image the Dockerfile builds: tracetune-worker:VERSION-ENGINE-TAG."""
    tag = base.rsplit("/", 1)[-1].partition(":")[2] or "latest"
    return f"{WORKER_REPOSITORY}:{version}-{engine.name}-{tag}"


def dockerfile(base: str, engine: EngineKind, study: str) -> str:
    """The worker image's Dockerfile; its build context is a tracetune source checkout."""
    return f"""\
# The tracetune worker image for study {study!r}: {base} (the {engine.shown} engine) with tracetune
# installed into the image's own Python, so that `tune` starts the engine as it does on a host.
# The build context is a tracetune checkout; {DOCKERIGNORE} (beside this file) keeps its
# virtual environment, runs and caches out of it. Build, then push where the cluster pulls from:
#   docker build -f THIS_FOLDER/{DOCKERFILE} -t REGISTRY/IMAGE:TAG TRACETUNE_CHECKOUT
#   docker push REGISTRY/IMAGE:TAG      # and give the Job that image (tune fleet --image ...)
FROM {base}
COPY . /opt/tracetune-src
# The packages the image ships (the engine, torch, CUDA libraries) are held at their versions: pip
# fails the build rather than replace one under the engine.
RUN python3 -m pip list --format=freeze | grep -vi '^tracetune==' > /tmp/image-packages.txt \\
 && python3 -m pip install --no-cache-dir --constraint /tmp/image-packages.txt /opt/tracetune-src \\
 && rm -rf /opt/tracetune-src /tmp/image-packages.txt \\
 && tune --help > /dev/null
ENTRYPOINT []
CMD ["tune", "--help"]
"""


# What the build context (a checkout) holds that the image must not: environments, runs, caches, VCS.
IGNORED = (".git", ".venv", "venv", "runs", "build", "dist", "*.egg-info", "**/__pycache__", "**/*.pyc",
           "test-artifacts", "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def dockerignore() -> str:
    """The Dockerfile's ignore file: a checkout without what only development or earlier runs made."""
    return "".join(f"{pattern}\n" for pattern in IGNORED)


def source_checkout() -> Path | None:
    """The tracetune checkout this command runs from (the build context), when it runs from one."""
    import tracetune

    root = Path(tracetune.__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None
