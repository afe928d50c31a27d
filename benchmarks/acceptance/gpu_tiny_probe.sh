#!/usr/bin/env bash
# Launch-bound shapes on the GPU in front of you, one call: the cost model's best Triton configs per shape
# (`gemmrl bench --triton-top`) beside every vendor path and gemmrl.mm (the package's H100 library relabelled for
# this GPU, as gpu_anyshape.sh serves it), then which kernel each vendor path launches there (kernel_names.py).
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) SET=anyshape_random40_seed0_launch-bound22 bash benchmarks/acceptance/gpu_tiny_probe.sh
# SET: a file in benchmarks/shapes (no .txt); DTYPE (fp16); TOP (6 configs a shape); PROTOCOLS (graph,cold);
# NAMES: comma list of M_N_K for kernel_names.py (none: skipped); BENCH_TIMEOUT (330 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck shell=bash disable=SC1091
source benchmarks/acceptance/gpu_env.sh
SHA=${GEMMRL_GIT_SHA}
DAY=$(date -u +%F)
DTYPE=${DTYPE:-fp16}
status=0
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
gemmrl lib export --library src/gemmrl/libraries/h100.json --gpu 'NVIDIA H100 80GB HBM3' --as-gpu "$GPU" \
  /tmp/served_library_probe.json || status=1
protos=${PROTOCOLS:-graph,cold}
out="$GEMMRL_OUT/h200_tiny-probe_triton-top${TOP:-6}_${SET}_${DTYPE}_${protos//,/-}_${SHA:0:12}_${DAY}.csv"
timeout "${BENCH_TIMEOUT:-330}" gemmrl bench --shapes "benchmarks/shapes/${SET}.txt" --dtype "$DTYPE" \
  --library /tmp/served_library_probe.json --protocol "$protos" --timing quick --triton-top "${TOP:-6}" \
  --no-progress --out "$out" 2>&1 | tail -4 || status=1
if [ -n "${NAMES:-}" ]; then
  timeout 120 python3 benchmarks/acceptance/kernel_names.py --mnk "$NAMES" --dtype "$DTYPE" 2>&1 | tail -40 \
    && mv "$GEMMRL_OUT/kernel_names.csv" "$GEMMRL_OUT/h200_kernel-names_${DTYPE}_${SHA:0:12}_${DAY}.csv" || status=1
fi
echo "sha=$SHA status=$status"
exit $status
