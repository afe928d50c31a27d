#!/usr/bin/env bash
# The reliability measurements on a GPU, one part per call (each fits the device tool's 10-minute limit):
#   PART=checks    the GPU tests of the timed-output check and the timing protocols, the adversarial suite (every
#                  attack's verdict, a CSV), and what fresh inputs cost (benchmarks/acceptance/fresh_inputs_cost.py)
#   PART=false     false rejections: the battery over 30 shapes x 100 seeds and the timed-output check over 30 shapes
#                  x 5 seeds, every vendor path and family (benchmarks/acceptance/false_rejections.py)
#   PART=faults    fault survival: 200 candidates, 10% planted faults, the tuner killed with SIGKILL and resumed
#                  (benchmarks/acceptance/fault_survival.py)
# Everything lands under $GEMMRL_OUT; a short table is printed last.
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) PART=checks bash benchmarks/acceptance/gpu_reliability.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/acceptance/gpu_env.sh
source benchmarks/acceptance/gpu_env.sh
PART=${PART:-checks}
SHA=${GEMMRL_GIT_SHA}
DAY=$(date -u +%F)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | grep -o 'h200\|h100\|a100' || echo gpu)
status=0
case "$PART" in
  checks)
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_outputs.py tests/test_fill.py tests/test_timing.py \
      -x 2>&1 | tail -15 | tee "$GEMMRL_OUT/gpu_tests_timing_${SHA:0:12}.txt" || status=1
    GEMMRL_ADVERSARIAL_CSV="$GEMMRL_OUT/${GPU}_adversarial_${SHA:0:12}_${DAY}.csv" timeout 210 \
      python3 -m pytest -q -p no:cacheprovider tests/adversarial/test_adversarial.py 2>&1 | tail -15 \
      | tee "$GEMMRL_OUT/gpu_tests_adversarial_${SHA:0:12}.txt" || status=1
    timeout 200 python3 benchmarks/acceptance/fresh_inputs_cost.py --out "$GEMMRL_OUT" --sha "$SHA" --reps 2 || status=1
    ;;
  false)
    timeout 560 python3 benchmarks/acceptance/false_rejections.py --out "$GEMMRL_OUT" --seeds 100 --timed-seeds 5 \
      --max-seconds 500 --build 2>&1 | grep -v "it/s\]" | tail -60 || status=1
    ;;
  faults)
    timeout 570 python3 benchmarks/acceptance/fault_survival.py --device cuda --out "$GEMMRL_OUT" --n 200 --fault-frac 0.1 \
      --kill-after 100 2>&1 | tail -40 || status=1
    ;;
  *) echo "PART=$PART: use checks, false or faults"; exit 2 ;;
esac
echo "PART=$PART sha=$SHA status=$status"
exit $status
