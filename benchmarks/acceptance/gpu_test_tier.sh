#!/usr/bin/env bash
# The gpu test tier on every visible GPU at once: the test files with gpu tests, dealt over the GPUs by their count of
# gpu tests (a file's weight in GPU_TIER_WEIGHTS multiplies it: CUTLASS batteries build and run many configs), each
# share in its own pytest process with its own build cache (CUDA_VISIBLE_DEVICES=i), each limited to GPU_TIER_S
# seconds. The CUTLASS configs the CUTLASS tests run are built first, in parallel on every core (GPU_TIER_PREBUILD=0
# skips it). Writes gpu-tier_<tag>_part<i>of<n>.xml (JUnit) and .log per share to $GEMMRL_OUT (GPU_TIER_TAG, default
# the git sha, names a run) and prints the counts.
#
#     GEMMRL_OUT=DIR GEMMRL_GIT_SHA=SHA bash benchmarks/acceptance/gpu_test_tier.sh [TESTS...]        (default: tests)
#     GPU_TIER_GPUS="1"  use only these GPUs (e.g. GPU 0 busy with a measurement)
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/acceptance/gpu_env.sh
. benchmarks/acceptance/gpu_env.sh
tag=${GPU_TIER_TAG:-$GEMMRL_GIT_SHA}
gpus=(${GPU_TIER_GPUS:-$(seq 0 $(($(nvidia-smi -L | wc -l) - 1)))})
n=${#gpus[@]}
if [ "${GPU_TIER_PREBUILD:-1}" = 1 ]; then
  python3 - <<'PY'
import os, sys, time
sys.path[:0] = ["tests", "tests/kernels"]
from gemmrl.kernels import cutlass_sm90 as cs
from test_cutlass_sm90 import GPU_CONFIGS, WIDE_CONFIGS
t = time.time()
built = cs.build_family(list(dict.fromkeys(GPU_CONFIGS + WIDE_CONFIGS)), jobs=os.cpu_count())
print(f"prebuilt {sum(b.ok for b in built.values())} of {len(built)} CUTLASS test configs in {time.time() - t:.0f} s")
PY
fi
python3 - "$n" "$GEMMRL_OUT/shares_$tag.txt" "${@:-tests}" <<'PY'
import collections, os, subprocess, sys
n, out, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
ids = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                      *paths], capture_output=True, text=True).stdout.split("\n")
count = collections.Counter(i.split("::")[0] for i in ids if "::" in i)
weight = dict(w.split("=") for w in os.environ.get("GPU_TIER_WEIGHTS", "test_cutlass_sm90.py=4").split())
cost = {f: c * float(next((v for k, v in weight.items() if f.endswith(k)), 1)) for f, c in count.items()}
shares, load = [[] for _ in range(n)], [0.0] * n
for f in sorted(cost, key=cost.get, reverse=True):  # greedy: the heaviest file to the lightest share
    i = load.index(min(load))
    shares[i].append(f)
    load[i] += cost[f]
with open(out, "w") as fh:
    fh.write("\n".join(" ".join(s) for s in shares) + "\n")
print(f"{sum(count.values())} gpu tests in {len(count)} files over {n} GPU(s); weighted loads {[round(x) for x in load]}")
PY
i=0
while read -r share; do
  g=${gpus[$i]}
  name="gpu-tier_${tag}_part$((i + 1))of${n}"
  # shellcheck disable=SC2086
  [ -n "$share" ] && CUDA_VISIBLE_DEVICES=$g GEMMRL_CACHE_DIR=$GEMMRL_CACHE_DIR/gpu$g \
    bash -c "mkdir -p \$GEMMRL_CACHE_DIR && cp -r $GEMMRL_CACHE_DIR/build \$GEMMRL_CACHE_DIR/ 2>/dev/null; \
    timeout ${GPU_TIER_S:-540} python3 -m pytest -q -m gpu -p no:cacheprovider -rfE $share \
    --junitxml=$GEMMRL_OUT/$name.xml >$GEMMRL_OUT/$name.log 2>&1; echo \"GPU $g: exit \$? \$(tail -n 1 $GEMMRL_OUT/$name.log)\"" &
  i=$((i + 1))
done <"$GEMMRL_OUT/shares_$tag.txt"
wait
grep -h "^FAILED\|^ERROR" "$GEMMRL_OUT"/gpu-tier_"${tag}"_part*.log | cut -c1-200 | head -n 30
