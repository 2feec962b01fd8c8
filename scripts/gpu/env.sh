# Source on the device machine: the kit's site dir, the extra wheels, tracetune's source.
export PYTHONPATH=/tmp/site:/tmp/site2:${TRACETUNE_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
export PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 TRACETUNE_HOME=/root/th PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
