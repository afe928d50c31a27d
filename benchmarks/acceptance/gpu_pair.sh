#!/usr/bin/env bash
# Two jobs at once on a machine of two GPUs (nvidia-h200-x2), one call: JOB0 on GPU 0 and JOB1 on GPU 1, each with
# half of the CPUs (taskset), after one shared set-up (gpu_env.sh; the jobs see GEMMRL_ENV_READY=1).
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) \
#     JOB0='env SETS=anyshape_models30_fp16_seed0:fp16 bash benchmarks/acceptance/gpu_anyshape.sh' \
#     JOB1='env SETS=anyshape_models30_bf16_seed0:bf16 bash benchmarks/acceptance/gpu_anyshape.sh' \
#     bash benchmarks/acceptance/gpu_pair.sh
# A job is a shell command line; several runs one after another go into one line with ';'. Each job's output goes
# to $GEMMRL_OUT/job0.log / job1.log, whose last lines are printed. The device returns at most 8 files from $OUT:
# this leaves the CSVs, JSON files and the journey cache tarballs there (7 at most, the rest packed with them) and packs
# everything else (summaries, logs, tarballs of vendor choices) into extras.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck shell=bash disable=SC1091
source benchmarks/acceptance/gpu_env.sh
export GEMMRL_ENV_READY=1
n=$(nproc)
half=$((n / 2))
status=0
CUDA_VISIBLE_DEVICES=0 taskset -c "0-$((half - 1))" bash -c "${JOB0:-true}" >"$GEMMRL_OUT/job0.log" 2>&1 &
p0=$!
sleep 3  # the jobs unpack carried caches into shared folders: not at the same instant
CUDA_VISIBLE_DEVICES=1 taskset -c "$half-$((n - 1))" bash -c "${JOB1:-true}" >"$GEMMRL_OUT/job1.log" 2>&1 &
p1=$!
wait "$p0" || status=1
wait "$p1" || status=1
for j in 0 1; do
  echo "=== job $j"
  tr '\r' '\n' <"$GEMMRL_OUT/job$j.log" | grep -v '^\s*$' | tail -"${TAIL:-14}"
done
bash benchmarks/acceptance/pack_out.sh "$GEMMRL_OUT" || status=1
ls "$GEMMRL_OUT"
echo "sha=${GEMMRL_GIT_SHA:-unknown} status=$status"
exit $status
