#!/usr/bin/env bash
# The vendor fallback on a GPU, one call: its GPU tests (tests/serve/test_dispatch.py), then gemmrl.mm with an empty
# library (every shape served by the fallback) against every vendor path on shapes no library holds, graph and cold.
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) bash benchmarks/acceptance/gpu_vendor_fallback.sh
#   SHAPES_FILE=benchmarks/shapes/anyshape_random40_seed0.txt DTYPE=fp16 TESTS=0 ... (a committed shapes file instead)
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck shell=bash disable=SC1091
source benchmarks/acceptance/gpu_env.sh
SHA=${GEMMRL_GIT_SHA}
SHAPES=${SHAPES:-37_4096_4096,3_3584_14336,5_14336_4096,129_8192_1024,300_4096_11008,1000_1000_776,777_5120_5120,2048_1536_4096}
status=0
[ "${TESTS:-1}" = 0 ] || timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/serve/test_dispatch.py \
  -k "unseen_shape or never_seen or capture" 2>&1 | tail -6 | tee "$GEMMRL_OUT/gpu_tests_vendor-fallback_${SHA:0:12}.txt" || status=1
python3 -c "from gemmrl.library import Library; Library().save('/tmp/empty_library.json')"
if [ -n "${SHAPES_FILE:-}" ]; then WHAT=(--shapes "$SHAPES_FILE"); TAG=$(basename "$SHAPES_FILE" .txt); else WHAT=(--mnk "$SHAPES"); TAG=8; fi
timeout "${BENCH_TIMEOUT:-150}" gemmrl bench "${WHAT[@]}" --dtype "${DTYPE:-fp16}" --library /tmp/empty_library.json --protocol graph,cold --timing quick \
  --no-progress --out "$GEMMRL_OUT/h200_vendor-fallback-empty-library_${TAG}_${DTYPE:-fp16}_graph-cold-quick_${SHA:0:12}_$(date -u +%F).csv" \
  2>&1 | tail -30 || status=1
echo "sha=$SHA status=$status"
