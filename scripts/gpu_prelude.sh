# Sourced by the scripts/gpu_*.sh run scripts (from the repository root; outputs under $OUT):
#   the device environment   this tree on PYTHONPATH; NVLink multicast off on the lent multi-GPU
#                            machines (qbench.dist sets the same on every rank it starts; exported
#                            here for pytest and torchrun too); wheels under .whl/ (ignored by git,
#                            carried to a machine without a package registry: the optional torchao
#                            peer) installed into /tmp/site, which joins PYTHONPATH
#   $OUT, $OUT/runs          where logs and run directories go (default runs/scratch)
#   qbench ARGS              this tree's command line (python3 -m qbench)
#   gpu_header               the GPUs, torch / triton versions and the commit, at the top of a log
#   pack_runs [DIR...]       $OUT/runs (and DIRs under $OUT) as one tarball: few files come back
set -uo pipefail
# absolute: tests spawn the command from their own temporary directories
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-runs/scratch}
mkdir -p "$OUT/runs"

qbench() { python3 -m qbench "$@"; }

gpu_header() {
  nvidia-smi -L
  nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log --oneline -1 2>/dev/null || true
}

pack_runs() {
  (cd "$OUT" && tar czf runs.tar.gz runs "$@" && rm -rf runs "$@")
}
