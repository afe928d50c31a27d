#!/usr/bin/env bash
# Any shape on the GPU in front of you, one call: the fallback race's GPU tests, then gemmrl.mm serving a library
# tuned on another GPU model (the package's H100 model library, relabelled for this GPU with `gemmrl lib export
# --as-gpu`) against every vendor path, on committed seeded shape files no library entry holds.
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) SETS="anyshape_models30_fp16_seed0:fp16 anyshape_models30_bf16_seed0:bf16" \
#     bash benchmarks/acceptance/gpu_anyshape.sh
# SETS: space-separated <file in benchmarks/shapes, no .txt>:<dtype>[:<protocols>]; PROTOCOLS (graph,cold) is the
# default; offline/server sets take WARMUP_S/BENCH_S/QPS (PIN_CPU=1: the timing thread held on one CPU). TESTS=0 skips the tests; LIBRARY=empty serves an empty one.
# PROBE: space-separated <file>:<dtype>, run first: lt_splits_probe.py (cuBLASLt's listed plans against the split-K
# configurations its heuristic does not list, as the race times them), PROBE_S seconds per set. HOSTCOST=1 adds the
# dispatch's host cost per call (dispatch_host_cost.py) after the sets. TUNABLEOP=1 also times, after each graph/cold
# set, torch.matmul with PyTorch's TunableOp on in its own process, and compares (tunableop_beside.py); TUNABLEOP=same
# instead runs each set with TunableOp on in the bench's process (gemmrl.mm, every vendor path and TunableOp's
# torch.matmul interleaved; only torch.matmul changes) and compares within that file.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck shell=bash disable=SC1091
source benchmarks/acceptance/gpu_env.sh
SHA=${GEMMRL_GIT_SHA}
DAY=$(date -u +%F)
status=0
if [ "${TESTS:-1}" != 0 ]; then
  timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/serve/test_dispatch.py \
    tests/kernels/test_vendor_configs.py tests/test_timing.py tests/kernels/test_decode_gemm.py \
    -k "unseen_shape or never_seen or capture or between_tuned or split_variants or fresh_timer or launch_bound or gemv_rows or refilled or first_call or plan_family or battery_repeat or decode_rows" \
    2>&1 | tail -6 \
    | tee "$GEMMRL_OUT/h200_gpu-tests_fallback-race_${SHA:0:12}_${DAY}.txt" || status=1
fi
for set in ${PROBE:-}; do  # cuBLASLt's listed plans against the split-K configurations it does not list
  IFS=: read -r name dtype <<<"$set"
  timeout "${PROBE_TIMEOUT:-300}" python3 benchmarks/acceptance/lt_splits_probe.py --shapes "benchmarks/shapes/${name}.txt" \
    --dtype "$dtype" --git "${SHA:0:12}" --budget-s "${PROBE_S:-240}" \
    --out "$GEMMRL_OUT/h200_lt-splits-probe_${name}_${dtype}_graph-cold_${SHA:0:12}_${DAY}.csv" 2>&1 | tail -45 || status=1
done
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ "${LIBRARY:-as-gpu}" = empty ]; then
  python3 -c "from gemmrl.library import Library; Library().save('/tmp/served_library.json')"; LIBTAG=empty-library
else
  gemmrl lib export --library src/gemmrl/libraries/h100.json --gpu 'NVIDIA H100 80GB HBM3' --as-gpu "$GPU" \
    /tmp/served_library.json || status=1
  LIBTAG=h100-models-library-as-h200
fi
for set in ${SETS:-}; do
  IFS=: read -r name dtype protos <<<"$set"
  protos=${protos:-${PROTOCOLS:-graph,cold}}
  extra=()
  case $protos in *offline*|*server*) extra=(--warmup-seconds "${WARMUP_S:-0.25}" --benchmark-seconds "${BENCH_S:-1}");; esac
  case $protos in *server*) extra+=(--target-qps "${QPS:-100}");; esac
  case $protos in *offline*|*server*) [ "${PIN_CPU:-0}" != 0 ] && extra+=(--pin-cpu);; esac
  tag=$LIBTAG
  tunable=()
  if [ "${TUNABLEOP:-0}" = same ]; then  # TunableOp on in this process: torch.matmul is TunableOp's, beside gemmrl.mm
    tag=${LIBTAG}_tunableop-on
    tunable=(env PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=1 PYTORCH_TUNABLEOP_VERBOSE=0
             "PYTORCH_TUNABLEOP_FILENAME=$GEMMRL_OUT/h200_tunableop-results_${name}_${SHA:0:12}_${DAY}.csv")
  fi
  part=()
  if [ -n "${PART:-}" ]; then part=(--part "$PART"); tag=${tag}_part${PART//\//of}; fi  # PART=K/N: a like share of the set
  out="$GEMMRL_OUT/h200_anyshape_${tag}_${name}_${protos//,/-}_${SHA:0:12}_${DAY}.csv"
  timeout "${BENCH_TIMEOUT:-400}" "${tunable[@]}" gemmrl bench --shapes "benchmarks/shapes/${name}.txt" --dtype "$dtype" \
    --library /tmp/served_library.json --protocol "$protos" --timing quick "${extra[@]}" "${part[@]}" --no-progress \
    --out "$out" \
    2>&1 | tail -4 || status=1
  if [ "${TUNABLEOP:-0}" = same ]; then
    python3 benchmarks/acceptance/tunableop_beside.py --ours "$out" --tunableop "$out" --out "${out%.csv}.beside.md" \
      || status=1
  elif [ "${TUNABLEOP:-0}" != 0 ] && [ "${protos//offline/}" = "$protos" ] && [ "${protos//server/}" = "$protos" ]; then
    # torch.matmul with TunableOp on, in a process of its own (it changes torch.matmul process-wide), the same shapes
    tun="$GEMMRL_OUT/h200_tunableop-beside_${name}_${protos//,/-}_${SHA:0:12}_${DAY}.csv"
    PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=1 PYTORCH_TUNABLEOP_VERBOSE=0 \
      PYTORCH_TUNABLEOP_FILENAME="$GEMMRL_OUT/h200_tunableop-results_${name}_${SHA:0:12}_${DAY}.csv" \
      timeout "${BENCH_TIMEOUT:-400}" gemmrl bench --shapes "benchmarks/shapes/${name}.txt" --dtype "$dtype" \
      --baselines torch --protocol "$protos" --timing quick --no-progress --out "$tun" 2>&1 | tail -2 || status=1
    python3 benchmarks/acceptance/tunableop_beside.py --ours "$out" --tunableop "$tun" \
      --out "${tun%.csv}.beside.md" || status=1
  fi
done
if [ "${HOSTCOST:-0}" != 0 ]; then  # the host cost of a seen shape's lookup (mm(out) less the served kernel's call)
  timeout "${HOSTCOST_TIMEOUT:-150}" python3 benchmarks/acceptance/dispatch_host_cost.py 2>&1 | tail -18 \
    && mv "$GEMMRL_OUT/dispatch_host_cost.csv" "$GEMMRL_OUT/h200_dispatch-host-cost_${SHA:0:12}_${DAY}.csv" || status=1
fi
[ -d "$GEMMRL_CACHE_DIR/vendor-choice" ] && tar czf "$GEMMRL_OUT/h200_vendor-choices_${LIBTAG}_${SHA:0:12}_${DAY}.tgz" \
  -C "$GEMMRL_CACHE_DIR" vendor-choice  # every race's plans and median times, for the findings
python3 - "$GEMMRL_OUT" <<'PY'
import csv, glob, math, sys
from collections import defaultdict
print(f"{'file':<78} {'protocol':<8} {'n':>3} {'geomean':>8} {'min':>6} {'<0.97':>5}")
for f in sorted(glob.glob(sys.argv[1] + "/h200_anyshape_*.csv")):
    t = defaultdict(dict)
    for r in csv.DictReader(open(f)):
        if r["candidate"] in ("gemmrl", "vendor_best") and not r.get("recheck") and r["time_ms"]:
            t[(r["protocol"], r["mnk"])][r["candidate"]] = float(r["time_ms"])
    by = defaultdict(list)
    for (p, m), v in t.items():
        if len(v) == 2:
            by[p].append(v["vendor_best"] / v["gemmrl"])
    for p, xs in sorted(by.items()):
        g = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"{f.rsplit('/', 1)[1][:78]:<78} {p:<8} {len(xs):>3} {g:>8.4f} {min(xs):>6.3f} {sum(x < .97 for x in xs):>5}")
PY
echo "sha=$SHA status=$status"
