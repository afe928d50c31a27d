#!/usr/bin/env bash
# A new user's journey on this GPU, from an empty cache: `gemmrl tune --model MODEL --budget-gpu-minutes BUDGET`
# (it writes the user library gemmrl.mm serves from), resumed across calls, then gemmrl.mm from that library against
# every vendor path on the model's ladder (the token counts tune tunes) and off it (committed seeded files:
# python -m gemmrl.measure.anyshape --journey MODEL).
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) STAGE=tune bash benchmarks/acceptance/gpu_journey.sh     # as often as needed
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) STAGE=bench bash benchmarks/acceptance/gpu_journey.sh
# The cache travels between calls: a call leaves it in $GEMMRL_OUT/journey_cache_<MODEL>_<DTYPES>.tgz (the trials
# store, the user library, the vendor choices; not the compiled objects, which the next machine rebuilds); put that
# file in .carry/journey and carry .carry/journey in the next call. Each model and dtype set has its own cache (two
# journeys run side by side on two GPUs, gpu_pair.sh). Each tune call appends its wall time and the
# store's device time to $GEMMRL_OUT/..._journey-tune_*.log. MODEL (qwen2.5-7b), BUDGET_GPU_MIN (10), WALL_MIN (7:
# one call's share), DTYPES (fp16), JSETS (the bench's sets: ladder off-ladder_seed0); PRIORS=1 proposes the shipped H100 library's picks first (tune --priors).
# GRID_PART=K/N tunes the K-th of N interleaved parts of CUDA-L2's 1000 grid shapes instead of a model (ROUNDS groups
# a shape, 1; its own cache, grid_partKofN_<DTYPES>): the H200 library's grid, a part per GPU, resumed across calls.
# SHAPES_FILE=NAME tunes benchmarks/shapes/NAME.txt instead (ROUNDS, 2; its own cache, NAME_<DTYPES>): the decode set.
# Both are for STAGE=tune: the bench stage reads the model's journey files; bench their libraries with gemmrl bench.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-qwen2.5-7b}
SHAPES_ARGS=(--model "$MODEL")
if [ -n "${SHAPES_FILE:-}" ]; then
  MODEL=$SHAPES_FILE
  SHAPES_ARGS=(--shapes "benchmarks/shapes/$SHAPES_FILE.txt" --rounds "${ROUNDS:-2}")
elif [ -n "${GRID_PART:-}" ]; then
  MODEL=grid_part${GRID_PART//\//of}
  SHAPES_ARGS=(--grid cuda-l2 --part "$GRID_PART" --rounds "${ROUNDS:-1}")
fi
JTAG=${MODEL}_${DTYPES:-fp16}
JTAG=${JTAG//,/-}
export GEMMRL_CACHE_DIR=/tmp/journey_cache_$JTAG  # empty unless a carried cache continues an earlier call
mkdir -p "$GEMMRL_CACHE_DIR"
carried=.carry/journey/journey_cache_$JTAG.tgz
if [ -f "$carried" ]; then tar xzf "$carried" -C "$GEMMRL_CACHE_DIR"; fi
# shellcheck shell=bash disable=SC1091
source benchmarks/acceptance/gpu_env.sh
SHA=${GEMMRL_GIT_SHA:0:12}
DAY=$(date -u +%F)
status=0
case ${STAGE:-tune} in
  tune)
    resume=()
    [ -f "$GEMMRL_CACHE_DIR/trials.sqlite" ] && resume=(--resume)
    [ "${PRIORS:-0}" != 0 ] && resume+=(--priors package --priors-gpu "NVIDIA H100 80GB HBM3")
    log="$GEMMRL_OUT/h200_journey-tune_${JTAG}_${SHA}_${DAY}.log"
    start=$SECONDS
    timeout "${TUNE_TIMEOUT:-540}" gemmrl tune "${SHAPES_ARGS[@]}" --dtypes "${DTYPES:-fp16}" --run journey "${resume[@]}" \
      --budget-gpu-minutes "${BUDGET_GPU_MIN:-10}" --budget-wall-minutes "${WALL_MIN:-7}" \
      --library-out "$GEMMRL_OUT/h200_journey-library_${JTAG}_${SHA}_${DAY}.json" 2>&1 | tail -12 | tee "$log" \
      || status=1
    echo "journey call: ${resume[*]:-from the start}, $((SECONDS - start)) s wall for this tune command" | tee -a "$log"
    tar czf "$GEMMRL_OUT/journey_cache_$JTAG.tgz" -C "$GEMMRL_CACHE_DIR" --exclude=./build --exclude='./*.lock' . \
      || status=1
    ;;
  bench)
    for set in ${JSETS:-ladder off-ladder_seed0}; do  # JSETS: one of them (two GPUs: one set each)
      timeout "${BENCH_TIMEOUT:-270}" gemmrl bench --shapes "benchmarks/shapes/journey_${MODEL}_${set}.txt" \
        --library default --protocol graph,cold --timing quick --no-progress \
        --out "$GEMMRL_OUT/h200_journey_${MODEL}_${set}_user-library_graph-cold_${SHA}_${DAY}.csv" 2>&1 | tail -3 \
        || status=1
    done
    python3 - "$GEMMRL_OUT" <<'PY'
import csv, glob, math, sys
from collections import defaultdict
for f in sorted(glob.glob(sys.argv[1] + "/h200_journey_*.csv")):
    t = defaultdict(dict)
    for r in csv.DictReader(open(f)):
        if r["candidate"] in ("gemmrl", "vendor_best") and not r.get("recheck") and r["verified"] == "true":
            t[(r["protocol"], r["mnk"])][r["candidate"]] = float(r["time_ms"])
    for p in ("graph", "cold"):
        xs = [v["vendor_best"] / v["gemmrl"] for (q, _), v in t.items() if q == p and len(v) == 2]
        if xs:
            g = math.exp(sum(map(math.log, xs)) / len(xs))
            print(f"{f.rsplit('/', 1)[1][:72]:<72} {p:<6} {len(xs):>3} {g:8.4f} {min(xs):6.3f}")
PY
    ;;
  *) echo "gpu_journey.sh: STAGE=${STAGE}; use tune or bench" >&2; exit 2 ;;
esac
echo "sha=$SHA status=$status"
