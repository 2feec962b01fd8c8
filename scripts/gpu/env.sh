# Environment on the GPU host: the staged site dirs, then tracetune's source laid out as one
# importable `tracetune` package (links into the checkout, as pyproject.toml's package-dir maps it),
# so a host without pip access to the project runs the checkout as it is.
SRC=${TRACETUNE_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
python3 - "$SRC" /tmp/tracetune-import <<'PY'
import os, sys, tomllib
src, dest = sys.argv[1], sys.argv[2]
mapping = tomllib.load(open(os.path.join(src, "pyproject.toml"), "rb"))["tool"]["setuptools"]["package-dir"]
os.makedirs(os.path.join(dest, "tracetune"), exist_ok=True)
for package, folder in mapping.items():
    parts = package.split(".")
    entries = ([(os.path.join(src, folder, f), os.path.join(dest, *parts, f)) for f in os.listdir(os.path.join(src, folder)) if f != "__pycache__"]
               if len(parts) == 1 else [(os.path.join(src, folder), os.path.join(dest, *parts))])
    for target, link in entries:
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)
PY
export PYTHONPATH=/tmp/site:/tmp/site2:/tmp/tracetune-import
export PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 TRACETUNE_HOME=/root/th PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
