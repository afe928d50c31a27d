#!/usr/bin/env bash
# One round of GPU work in one invocation (< 10 minutes on an H100):
#   1. the gpu test tier,
#   2. the 60-shape grid sweep (--sample 60 --seed 0) in protocols graph, cold and offline,
#   3. a short table last.
# Writes everything under $GEMMRL_OUT (default $OUT, else /tmp/gemmrl_out); commit what comes back under
# benchmarks/results/. The GPU machine gets no .git: pass the commit as GEMMRL_GIT_SHA.
#   GEMMRL_GIT_SHA=$(git rev-parse --short=12 HEAD) bash scripts/gpu_round.sh
# Knobs: GPU_TESTS_S / SWEEP_S (time limits), RESUME_CSV (a partial sweep CSV to continue), SKIP_TESTS=1,
# PYTEST_ARGS (extra pytest arguments).
set -uo pipefail
cd "$(dirname "$0")/.."
export GEMMRL_OUT=${GEMMRL_OUT:-${OUT:-/tmp/gemmrl_out}}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export GEMMRL_CACHE_DIR=${GEMMRL_CACHE_DIR:-/tmp/gemmrl_cache}
mkdir -p "$GEMMRL_OUT"
: "${GEMMRL_GIT_SHA:=unknown}"
export GEMMRL_GIT_SHA

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version,temperature.gpu --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "(pip install -e . failed; using PYTHONPATH=src)"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${GPU_TESTS_S:-180}" python3 -m pytest -q -m gpu tests -p no:cacheprovider ${PYTEST_ARGS:-} >"$GEMMRL_OUT/gpu_tests.log" 2>&1
  echo "gpu tier: exit $? ; $(tail -n 1 "$GEMMRL_OUT/gpu_tests.log")"
  grep -E "^(FAILED|ERROR)" "$GEMMRL_OUT/gpu_tests.log" | head -20
fi

day=$(date +%F)
gpu=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print(next((k for k in ('h200','h100','a100') if k in n), 'gpu'))")
csv="$GEMMRL_OUT/${gpu}_grid60s0_graph-cold-offline_${day}.csv"
if [ -n "${RESUME_CSV:-}" ] && [ -f "$RESUME_CSV" ]; then cp "$RESUME_CSV" "$csv"; fi
timeout "${SWEEP_S:-420}" python3 -m gemmrl.cli bench --grid cuda-l2 --sample 60 --seed 0 \
  --protocol graph,cold,offline --out "$csv" >"$GEMMRL_OUT/sweep.log" 2>&1
echo "sweep: exit $?"
tail -c 400 "$GEMMRL_OUT/sweep.log" | tr "\r" "\n" | tail -n 2
python3 scripts/round_table.py "$csv"
