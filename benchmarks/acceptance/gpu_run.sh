#!/usr/bin/env bash
# The GPU acceptance runs in one invocation: the stages below, in this order, each with its own time limit (together
# < 10 minutes on an H100); a stage is named by what it does and switched on by its variable:
#   tests        the gpu test tier                        (skip: SKIP_TESTS=1;  limit GPU_TESTS_S)
#   sweep        the 60-shape grid sweep (--sample 60 --seed 0) in protocols graph, cold and offline
#                                                          (skip: SKIP_SWEEP=1;  limit SWEEP_S)
#   repeat       repeatability: 12 grid shapes (--sample 12 --seed 7) measured twice in graph
#                                                          (skip: SKIP_REPEAT=1; limit REPEAT_S)
#      sweep and repeat are off by default in a run that asks for any targeted stage below (TRITON_SHAPES, FAMILIES,
#      TINY, NCU_SPECS, GPU_TESTS, ...; benchmarks/acceptance/gpu_run_focus.sh): SWEEP=1 / REPEAT=1 ask for them there.
#   readme       the README's first command, verbatim, from a copy of the tree (skip: SKIP_README=1)
#   triton       only with TRITON_SHAPES=FILE: gemmrl select (the cost model's TRITON_TOP configs + TRITON_EXPLORE more per
#      shape, screened in graph and cold), then the selection re-measured by gemmrl bench --triton-from
#      (limits TRITON_SELECT_S, TRITON_REMEASURE_S; SKIP_SELECT / SKIP_REMEASURE; SEL_CSV / REM_CSV resume;
#      TRITON_PROTOCOL / TRITON_LAYOUTS: what the selection screens, default graph,cold and tn,nn; TRITON_PDL:
#      gemmrl select --pdl off|on|both, default off; TRITON_TAG: added to both files' names; TRITON_SELECT_ARGS /
#      TRITON_REMEASURE_ARGS: extra select / bench arguments, e.g. "--configs @FILE --diverse" / "--timing quick";
#      the retrieval run's recipe adds "--retrieve benchmarks/results/h100/h100_*triton-select*.csv* --retrieve-per-shape 3":
#      earlier screens' winners on the nearest shapes, from the committed CSVs that travel with the tree)
#   serve        only with SERVE_SHAPES=FILE (the serving bar: a library built, then gemmrl.mm measured), the stages named in SERVE_STAGES (default all, in order):
#      select   gemmrl select on SERVE_SELECT_SHAPES (default SERVE_SHAPES; graph only; TRITON_TOP/TRITON_EXPLORE)
#      build    gemmrl bench --triton-from (the selection + SERVE_SEL_EXTRA CSVs) in graph,offline: the library's
#               selection run; then gemmrl lib build -> $GEMMRL_OUT/library.json
#      measure  gemmrl bench --library library.json in graph,offline: gemmrl.mm against the vendor paths, the run
#               that counts (noise rule: gemmrl re-measured 3x where > 2% slower than vendor_best)
#      hostcost benchmarks/acceptance/dispatch_host_cost.py: gemmrl.mm's host time per call through each compiled hot path
#      example  examples/transformer_block.py at SERVE_TOKENS (default "16 32")
#      (SERVE_SEL_CSV / SERVE_BUILD_CSV / SERVE_LIB / SERVE_MEASURE_CSV: files of an earlier call to resume from)
#   families     only with FAMILIES=1 (the CUTLASS-family bar: CUTLASS selected and re-measured beside Triton), the stages in FAMILIES_STAGES (default all, in order):
#      compile    benchmarks/acceptance/compile_throughput.py: the family built from scratch with 16 parallel nvcc (configs/min)
#      select     gemmrl select --family cutlass on FAMILIES_SHAPES (default the 100 grid shapes --sample 100 --seed 1)
#      remeasure  gemmrl bench --triton-from <the Triton-family bar's selection> --cutlass-from <select> in graph,cold: the run
#                 that counts; then benchmarks/acceptance/family_table.py (limits FAMILIES_SELECT_S, FAMILIES_REMEASURE_S;
#                 FAMILIES_SELECT_ARGS / TRITON_SELECT_ARGS: extra gemmrl select arguments, e.g. --timing full;
#                 the Triton selection re-measured is the triton stage's when it ran, else FAMILIES_TRITON_SEL;
#                 CSEL_CSV / CREM_CSV: files of an earlier call to resume from; FAMILIES_TRITON_SEL and
#                 FAMILIES_CUTLASS_SEL may name several selection files, space-separated, e.g. committed ones with no
#                 select stage; FAMILIES_REMEASURE_ARGS: extra bench arguments, e.g. "--timing quick";
#                 FAMILIES_AHEAD="PASS.csv.gz ...": re-measure only the shapes whose screen best came within
#                 FAMILIES_AHEAD_MIN (0.98) of vendor_best in those earlier rows (benchmarks/acceptance/screen_ahead.py))
#      Carried: .whl/nvidia_cutlass-*.whl (the CUTLASS headers) and .carry/gemmrl_cache (prebuilt CUTLASS objects).
#   loop         only with LOOP=1 (the grid-library bar: the tuning loop) on LOOP_SHAPES (default benchmarks/shapes/held50_grid_seed2.txt,
#      50 grid shapes outside the 100 the shipped policy trained on), the stages in LOOP_STAGES (default all):
#      sweep    the exhaustive reference: gemmrl select, Triton (top 16 + explore 8, tn and nn) and CUTLASS (tn)
#      tune     gemmrl tune --proposer rl (LOOP_GROUP x LOOP_ROUNDS per shape; trials in $GEMMRL_OUT)
#      remeasure gemmrl bench --triton-from/--cutlass-from the tuned rows, every vendor path: the run that counts
#      (LOOP_TSEL_CSV / LOOP_CSEL_CSV / LOOP_ROWS_CSV / LOOP_REM_CSV: files of an earlier call to resume from;
#      LOOP_TRIALS: the trials store a cut-off tune resumes; LOOP_POLICY: the policy to start from; any may be .gz); the store comes
#      back as trials.sqlite.gz; LOOP_TUNE_MIN is each tune's whole wall budget (set-up and precompile inside)
#      LOOP_SHAPES_ARGS replaces --shapes LOOP_SHAPES, e.g. "--grid cuda-l2 --part 1/5" (the library chunks);
#      LOOP_BENCH_ARGS adds to the re-measure's bench, e.g. "--timing quick"; LOOP_PARTS="3/5 4/5" tunes those
#      parts of the grid one after the other (runs grid1000-part3of5 ...; export with gemmrl trials export);
#      LOOP_TUNE_ARGS adds to each part's tune, e.g. "--more-below 1.02" with LOOP_ROUNDS=3;
#      the re-measure: LOOP_FROM="ROWS.csv.gz ..." (tune rows of several parts) or LOOP_LIBRARY=FILE (gemmrl.mm
#      served from it), LOOP_PROTOCOL (default graph,cold), LOOP_SHARDS=N|gpus: one bench per GPU on every N-th
#      shape, each its own CSV (<name>_shardIofN.csv; LOOP_REM_DIR carries earlier shards in to resume: one file per shard named
#      *_shardIofN[-partial].csv[.gz]; with LOOP_REM_DIR set, one GPU is shard 0 of 1 and resumes the same way)
#   dask         only with DASK=1 (the distributed bar, Dask; a machine with 2 GPUs): benchmarks/acceptance/dask_scaling.py, one tuning chunk through
#      Dask on 1 GPU then on 2 (DASK_N shapes of DASK_SHAPES; limit DASK_S); outputs in dask.tgz
#   adversarial  only with ADVERSARIAL=1 (the adversarial suite, false rejections, fault survival), the stages in ADVERSARIAL_STAGES (default all, in order):
#      adversarial  tests/adversarial/test_adversarial.py on the GPU (every planted cheat and fault through the sandbox;
#                   GEMMRL_ADVERSARIAL_CSV -> <gpu>_adversarial_<date>.csv) and the battery's gpu tests
#      falserej     benchmarks/acceptance/false_rejections.py: every vendor path and our families, 100 seeds on 30 shapes
#      faults       benchmarks/acceptance/fault_survival.py: 200 candidates with 10% planted faults, then kill -9 and resume
#      (limits ADVERSARIAL_ADV_S, ADVERSARIAL_FR_S, ADVERSARIAL_FAULTS_S; FAULTS_ARGS: extra fault_survival.py arguments)
#   headroom     only with HEADROOM=1 (how much room the vendor leaves; gemmrl headroom): HEADROOM_SHAPES
#      (default benchmarks/shapes/decode-grid120.txt) in HEADROOM_PROTOCOL (default graph,cold) with HEADROOM_ARGS
#      (default --quick), then with HEADROOM_GRID=1 the 1000 grid shapes in cold with --quick (limits HEADROOM_S,
#      HEADROOM_GRID_S; HEADROOM_CSV / HEADROOM_GRID_CSV: files of an earlier call to resume from)
#   cuda-source  only with CUDA_SOURCE=FILE.cu: gemmrl bench --cuda-source FILE (ABI gemmrl, layout tn, --declare
#      CUDA_SOURCE_DECLARE, default K%8) on CUDA_SOURCE_SHAPES in graph,cold, sandboxed (limit CUDA_SOURCE_S;
#      CUDA_SOURCE_CSV resumes)
#   wgmma        only with WGMMA=1 (the TMA + wgmma family with cluster/DSMEM and global split-K, kernels/wgmma_gemm.py), the
#      stages in WGMMA_STAGES (default select,remeasure) on WGMMA_SHAPES (default benchmarks/shapes/small72.txt):
#      select     gemmrl select --family wgmma in graph,cold
#      remeasure  gemmrl bench --wgmma-from <select> (+ WGMMA_EXTRA, e.g. --triton-from CSV) in graph,cold: the run
#                 that counts (limits WGMMA_SELECT_S, WGMMA_REMEASURE_S; WSEL_CSV / WREM_CSV resume); with
#                 WGMMA_WINNERS=1 only the shapes where the screen had wgmma ahead of its best reference
#   tiny         only with TINY=1 (the small-tile mma.sync family with one-launch cluster split-K, kernels/tiny_gemm.py): the
#      same two stages on TINY_SHAPES (default benchmarks/shapes/tiny_first24.txt), TINY_STAGES, TINY_SELECT_S,
#      TINY_REMEASURE_S, TINY_WINNERS, TINY_EXTRA (e.g. --library FILE: gemmrl.mm beside it), TSEL_CSV / TREM_CSV
#   merge        only with MERGE_LIB=FILE (a grid library) and MERGE_SPLICE=FILE (benchmarks/acceptance/library_measure.py's markdown of its
#      measure passes): the cells of MERGE_SELECT (default this run's tiny selection) whose screen beats the splice
#      by MERGE_MARGIN (1.04; benchmarks/acceptance/library_merge_rows.py screened --splice-md) merged into a copy of the library
#      (gemmrl lib build --generated-only --no-buckets; <gpu>_grid1000_library_<MERGE_TAG>_<day>.json.gz), then the
#      changed shapes measured with gemmrl.mm served from it, a separate run from the selection: graph and cold
#      (--timing quick) and offline against cuBLASLt autotuned (limit MERGE_S a bench)
#   efficiency   only with EFFREM=1 (the grid-library bar's search efficiency with the noise rule): benchmarks/acceptance/efficiency_remeasure.py picks,
#      per method (exhaustive sweep, cost model, EFFREM_POLICIES, random), the arm it would serve on each held-out
#      screen (EFFREM_TEST, default the held50s2 screens) at EFFREM_BUDGET (default arms:4,gpu:0.15), then times every
#      picked arm again beside the screen's references, EFFREM_REPEATS (3) interleaved rounds, and reports the
#      shares valued by that run (limit EFFREM_S; EFFREM_CSV resumes)
#   table        a short table last (benchmarks/acceptance/vendor_paths_table.py on each results file).
# Writes everything under $GEMMRL_OUT (default $OUT, else /tmp/gemmrl_out); commit what comes back under
# benchmarks/results/. The GPU machine gets no .git: pass the commit as GEMMRL_GIT_SHA.
#   GEMMRL_GIT_SHA=$(git rev-parse --short=12 HEAD) bash benchmarks/acceptance/gpu_run.sh
# PDL_PROBE=1: first, benchmarks/acceptance/pdl_probe.py (PDL_PROBE_ARGS; limit PDL_PROBE_S): Triton configs without and with
#   programmatic dependent launch, beside torch.matmul, in graph, graph after a foreign kernel, and cold.
# COLD_ANATOMY=1: first, benchmarks/acceptance/cold_anatomy.py (COLD_ANATOMY_ARGS, e.g. "--library LIB.json.gz"; limit
#   COLD_ANATOMY_S): probe kernels (empty, one load, load chains, one-CTA tiles, straight-line code of 1.6-394 KiB)
#   and tiny GEMMs in graph and cold: where a tiny call's cold time goes.
# PACE_PROBE=1: first, benchmarks/acceptance/pace_probe.py (limit PACE_PROBE_S): one CTA's L2 -> shared-memory pace per K step by
#   load method (cp.async, 1-D bulk copies, 2-D TMA; PACE_METHODS, default "0 1 2"; 3 and 4: 3-D TMA boxes of 4 K
#   chunks), spread, in one 16-CTA cluster, and with every SM pulling.
# NCU_SPECS="M_N_K:which:config[:knobs] ...": first, ncu's details (SpeedOfLight, compute, memory, warp stalls,
#   launch, occupancy) of one call each (which: triton | cutlass | tiny | vendor; limit NCU_S per call), in ncu_*.log;
#   NCU_CACHE="all none" profiles each with ncu's cache control all (L2 flushed first, default) and none; NCU_EXTRA:
#   more ncu arguments; NCU_STALLS=1: also each warp stall reason's cycles per issued instruction (printed).
# PROBE_SPECS="M_N_K:layout ...": first, the offline crowd probe (benchmarks/acceptance/offline_host_probe.py, PROBE_CROWD=2).
# Other knobs: RESUME_CSV (a partial sweep CSV to continue), PYTEST_ARGS (extra pytest arguments, split on spaces),
# PYTEST_K (one -k expression, spaces kept: PYTEST_K="battery or deterministic"), GPU_TESTS (test paths, default
# tests), SKIP_HOTPATH=1 (no gemmrl.mm hot-path build: a run that times no gemmrl.mm call).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benchmarks/acceptance/gpu_env.sh
. benchmarks/acceptance/gpu_env.sh
tree=$PWD
# gemmrl.mm's hot path built against this torch (fastpath_torch.cpp, ~20 s once), so no timed run pays for it
# (SKIP_HOTPATH=1: a run that times no gemmrl.mm call)
[ "${SKIP_HOTPATH:-0}" = 1 ] || python3 -c "import time; from gemmrl.serve import fastpath as f; t = time.time(); m = f.load_kind('torch'); \
print(f'hot path torch: {\"built\" if m else f.why(\"torch\")[:300]} in {time.time() - t:.0f} s')"

day=$(date +%F)
if [ "${PDL_PROBE:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  timeout "${PDL_PROBE_S:-150}" python3 benchmarks/acceptance/pdl_probe.py ${PDL_PROBE_ARGS:-} \
    --out "$GEMMRL_OUT/pdl-probe_graph-foreign-cold_${GEMMRL_GIT_SHA}_${day}.csv" >"$GEMMRL_OUT/pdl_probe.log" 2>&1
  echo "pdl probe: exit $?"; cut -c1-170 "$GEMMRL_OUT/pdl_probe.log" | tail -n 40
fi

if [ "${COLD_ANATOMY:-0}" = 1 ]; then  # where a tiny call's cold time goes (benchmarks/acceptance/cold_anatomy.py)
  # shellcheck disable=SC2086
  timeout "${COLD_ANATOMY_S:-150}" python3 benchmarks/acceptance/cold_anatomy.py ${COLD_ANATOMY_ARGS:-} \
    --out "$GEMMRL_OUT/cold-anatomy_graph-cold_${GEMMRL_GIT_SHA}_${day}.csv" >"$GEMMRL_OUT/cold_anatomy.log" 2>&1
  echo "cold anatomy: exit $?"; cut -c1-120 "$GEMMRL_OUT/cold_anatomy.log" | tail -n 40
fi

if [ "${PACE_PROBE:-0}" = 1 ]; then  # how fast one CTA streams K slices from L2, by load method (benchmarks/acceptance/pace_probe.py)
  for m in ${PACE_METHODS:-0 1 2}; do  # a process per method: a fault in one loses nothing of the others
    timeout "${PACE_PROBE_S:-100}" python3 benchmarks/acceptance/pace_probe.py --methods "$m" \
      --out "$GEMMRL_OUT/pace-probe-m${m}_graph_${GEMMRL_GIT_SHA}_${day}.csv" >"$GEMMRL_OUT/pace_probe_m$m.log" 2>&1
    echo "pace probe method $m: exit $?"; cut -c1-120 "$GEMMRL_OUT/pace_probe_m$m.log" | tail -n 30
  done
fi

if [ -n "${NCU_SPECS:-}" ]; then  # Nsight Compute details of single calls: "M_N_K:which:config ..." (gemmrl.measure.ncu run)
  if [ "${NCU_STALLS:-0}" = 1 ]; then  # where a warp's cycles between two issued instructions go, by reason
    stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
      short_scoreboard wait mio_throttle lg_throttle math_pipe_throttle not_selected selected dispatch_stall membar \
      no_instruction drain sleeping branch_resolving tex_throttle misc imc_miss)
    NCU_EXTRA="${NCU_EXTRA:-} --metrics ${stalls%,}"
  fi
  for spec in $NCU_SPECS; do
    IFS=: read -r mnk which cfg knobs <<<"$spec"
    for cc in ${NCU_CACHE:-all}; do  # ncu's --cache-control: all flushes before the call (cold), none keeps L2 (warm)
      log="$GEMMRL_OUT/ncu_${mnk}_${which}_${cfg}$([ "$cc" = all ] || echo "_cache-$cc").log"
      timeout "${NCU_S:-120}" ncu --clock-control none --cache-control "$cc" --profile-from-start off \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section LaunchStats --section Occupancy ${NCU_EXTRA:-} python3 -m gemmrl.measure.ncu run --mnk "$mnk" \
        --which "$which" --config "$cfg${knobs:+:$knobs}" --vendor "$cfg" >"$log" 2>&1
      echo "ncu $mnk $which $cfg cache-control $cc: exit $?"
      grep -E "SM Frequency|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Registers Per|Warp Cycles Per Issued" "$log" | head -13
      grep -E "issue_stalled_.*ratio" "$log" | awk '$NF + 0 >= 0.05' | sed 's/smsp__average_warps_issue_stalled_//'
    done
  done
fi

if [ -n "${PROBE_SPECS:-}" ]; then  # the offline crowd probe (benchmarks/acceptance/offline_host_probe.py) on "M_N_K:layout ..."
  # shellcheck disable=SC2086
  PROBE_CROWD=${PROBE_CROWD:-2} timeout "${PROBE_S:-90}" python3 benchmarks/acceptance/offline_host_probe.py \
    "${SERVE_LIB:-src/gemmrl/libraries/h100.json}" $PROBE_SPECS >"$GEMMRL_OUT/offline_host_probe.log" 2>&1
  echo "offline crowd probe: exit $?"; cat "$GEMMRL_OUT/offline_host_probe.log" | cut -c1-140
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  timeout "${GPU_TESTS_S:-180}" python3 -m pytest -q -m gpu ${GPU_TESTS:-tests} -p no:cacheprovider ${PYTEST_ARGS:-} \
    ${PYTEST_K:+-k "$PYTEST_K"} >"$GEMMRL_OUT/gpu_tests.log" 2>&1
  echo "gpu tier: exit $? ; $(tail -n 1 "$GEMMRL_OUT/gpu_tests.log")"
  grep -E "^(FAILED|ERROR)" "$GEMMRL_OUT/gpu_tests.log" | head -20
fi

gpu=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print(next((k for k in ('h200','h100','a100') if k in n), 'gpu'))")
tables=()
# shellcheck source=benchmarks/acceptance/gpu_run_focus.sh
. benchmarks/acceptance/gpu_run_focus.sh
if [ -n "$targeted_stages" ]; then
  echo "targeted stages: $targeted_stages (SKIP_SWEEP=${SKIP_SWEEP:-0} SKIP_REPEAT=${SKIP_REPEAT:-0})"
fi
if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  csv="$GEMMRL_OUT/${gpu}_grid60s0_graph-cold-offline_${day}.csv"
  if [ -n "${RESUME_CSV:-}" ] && [ -f "$RESUME_CSV" ]; then cp "$RESUME_CSV" "$csv"; fi
  timeout "${SWEEP_S:-420}" python3 -m gemmrl.cli bench --grid cuda-l2 --sample 60 --seed 0 \
    --protocol graph,cold,offline --out "$csv" >"$GEMMRL_OUT/sweep.log" 2>&1
  echo "sweep: exit $?"
  tail -c 400 "$GEMMRL_OUT/sweep.log" | tr "\r" "\n" | tail -n 2
  tables+=("$csv")
fi

if [ "${SKIP_REPEAT:-0}" != 1 ]; then
  rcsv="$GEMMRL_OUT/${gpu}_grid12s7-graph-repeat2_${day}.csv"
  timeout "${REPEAT_S:-150}" python3 -m gemmrl.cli bench --grid cuda-l2 --sample 12 --seed 7 --protocol graph \
    --repeat 2 --no-progress --out "$rcsv" >"$GEMMRL_OUT/repeat.log" 2>&1
  echo "repeat: exit $?"
  tables+=("$rcsv")
fi

if [ "${SKIP_README:-0}" != 1 ]; then
  # the README's first line, verbatim, in a copy of the tree (as a new user would run it), on PATH's python
  cmd=$(grep -m1 -E '^python3 -m pip install .*gemmrl bench' README.md | sed 's/ *#.*//')
  rm -rf /tmp/gemmrl_readme && mkdir -p /tmp/gemmrl_readme && cp -r "$tree"/. /tmp/gemmrl_readme/ 2>/dev/null
  touch /tmp/gemmrl_readme/.readme_marker
  ( cd /tmp/gemmrl_readme && unset PYTHONPATH && export GEMMRL_CACHE_DIR=/tmp/gemmrl_readme_cache \
      && timeout "${README_S:-120}" bash -c "$cmd" ) >"$GEMMRL_OUT/readme_command.log" 2>&1
  rc=$?
  echo "README command \`$cmd\`: exit $rc"
  tail -n 25 "$GEMMRL_OUT/readme_command.log" | tr "\r" "\n" | grep -v "^\s*$" | tail -n 12
  find /tmp/gemmrl_readme/benchmarks/results -name "*.csv" -newer /tmp/gemmrl_readme/.readme_marker \
    -exec sh -c 'cp "$1" "$2/readme-command_$(basename "$1")"' _ {} "$GEMMRL_OUT" \;
  python3 -m pip install -q --no-deps --no-build-isolation -e "$tree" >/dev/null 2>&1  # back to this tree
fi

if [ -n "${TRITON_SHAPES:-}" ]; then
  # the Triton-family bar's protocol: select one Triton config per shape and protocol by screening the cost model's TRITON_TOP
  # configs plus TRITON_EXPLORE from a shared random pool (gemmrl select), then re-measure only the selected ones
  # against the vendor paths in a second run (gemmrl bench --triton-from): that second run is what counts.
  # SEL_CSV / REM_CSV: partial files of an earlier call to resume; SKIP_REMEASURE=1 stops after the selection.
  tag=$(basename "${TRITON_SHAPES%.*}")${TRITON_TAG:+_$TRITON_TAG}
  sel="$GEMMRL_OUT/${gpu}_${tag}_triton-select-top${TRITON_TOP:-24}-explore${TRITON_EXPLORE:-16}-pdl-${TRITON_PDL:-off}_${GEMMRL_GIT_SHA}_${day}.csv"
  rem="$GEMMRL_OUT/${gpu}_${tag}_triton-selected-remeasure_graph-cold_${GEMMRL_GIT_SHA}_${day}.csv"
  if [ -n "${SEL_CSV:-}" ] && [ -f "$SEL_CSV" ]; then cp "$SEL_CSV" "$sel"; fi
  if [ -n "${REM_CSV:-}" ] && [ -f "$REM_CSV" ]; then cp "$REM_CSV" "$rem"; fi
  triton_sel_out=$sel  # the FAMILIES stage re-measures this selection beside its own unless FAMILIES_TRITON_SEL is set
  if [ "${SKIP_SELECT:-0}" != 1 ]; then
    # shellcheck disable=SC2086
    timeout "${TRITON_SELECT_S:-300}" python3 -m gemmrl.cli select --shapes "$TRITON_SHAPES" --top "${TRITON_TOP:-24}" \
      --explore "${TRITON_EXPLORE:-16}" --protocol "${TRITON_PROTOCOL:-graph,cold}" --layouts "${TRITON_LAYOUTS:-tn,nn}" \
      --pdl "${TRITON_PDL:-off}" ${TRITON_SELECT_ARGS:-} --no-progress --out "$sel" >"$GEMMRL_OUT/triton_select.log" 2>&1
    echo "triton selection: exit $? ($(grep -c . "$sel" 2>/dev/null) lines)"
    tail -n 3 "$GEMMRL_OUT/triton_select.log"
  fi
  if [ "${SKIP_REMEASURE:-0}" != 1 ]; then
    # shellcheck disable=SC2086
    timeout "${TRITON_REMEASURE_S:-240}" python3 -m gemmrl.cli bench --shapes "$TRITON_SHAPES" --triton-from "$sel" \
      --protocol graph,cold ${TRITON_REMEASURE_ARGS:-} --no-progress --out "$rem" >"$GEMMRL_OUT/triton_remeasure.log" 2>&1
    echo "triton re-measure: exit $?"
    tables+=("$rem")
  fi
fi

if [ -n "${SERVE_SHAPES:-}" ]; then
  tag=$(basename "${SERVE_SHAPES%.*}")
  stages=${SERVE_STAGES:-select,build,hostcost,measure,example}
  ssel="$GEMMRL_OUT/${gpu}_${tag}_triton-select-top${TRITON_TOP:-8}-explore${TRITON_EXPLORE:-4}-graph_${day}.csv"
  sbuild="$GEMMRL_OUT/${gpu}_${tag}_library-selection_graph-offline_${day}.csv"
  smeas="$GEMMRL_OUT/${gpu}_${tag}_gemmrl-mm_graph-offline_${day}.csv"
  slib="$GEMMRL_OUT/library.json"
  for pair in "SERVE_SEL_CSV:$ssel" "SERVE_BUILD_CSV:$sbuild" "SERVE_MEASURE_CSV:$smeas" "SERVE_LIB:$slib"; do
    var=${pair%%:*}; dst=${pair#*:}; src=${!var:-}
    if [ -n "$src" ] && [ -f "$src" ]; then cp "$src" "$dst"; fi
  done
  if [[ $stages == *select* ]]; then
    timeout "${SERVE_SELECT_S:-240}" python3 -m gemmrl.cli select --shapes "${SERVE_SELECT_SHAPES:-$SERVE_SHAPES}" \
      --top "${TRITON_TOP:-8}" --explore "${TRITON_EXPLORE:-4}" --protocol graph --no-progress --out "$ssel" \
      >"$GEMMRL_OUT/serve_select.log" 2>&1
    echo "serve select: exit $? ($(grep -c . "$ssel" 2>/dev/null) lines)"
    tail -n 2 "$GEMMRL_OUT/serve_select.log"
  fi
  if [[ $stages == *build* ]]; then
    # shellcheck disable=SC2086
    timeout "${SERVE_BUILD_S:-330}" python3 -m gemmrl.cli bench --shapes "$SERVE_SHAPES" --triton-from "$ssel" \
      ${SERVE_SEL_EXTRA:-} --protocol graph,offline --no-progress --out "$sbuild" >"$GEMMRL_OUT/serve_build.log" 2>&1
    echo "serve build (library selection run): exit $?"
    tail -n 2 "$GEMMRL_OUT/serve_build.log"
    python3 -m gemmrl.cli lib build "$sbuild" --out "$slib" --replace --trials "$GEMMRL_OUT/trials.sqlite"
  fi
  if [[ $stages == *hostcost* ]]; then
    timeout 150 python3 benchmarks/acceptance/dispatch_host_cost.py >"$GEMMRL_OUT/dispatch_host_cost.log" 2>&1
    echo "dispatch host cost: exit $?"; grep -E "^(torch|c) " "$GEMMRL_OUT/dispatch_host_cost.log" | cut -c1-150
  fi
  if [[ $stages == *measure* ]]; then
    timeout "${SERVE_MEASURE_S:-400}" python3 -m gemmrl.cli bench --shapes "$SERVE_SHAPES" --library "$slib" \
      --protocol graph,offline --no-progress --out "$smeas" >"$GEMMRL_OUT/serve_measure.log" 2>&1
    echo "serve measure (gemmrl.mm): exit $?"
    tail -n 2 "$GEMMRL_OUT/serve_measure.log"
    tables+=("$smeas")
    python3 benchmarks/acceptance/serving_table.py "$smeas" --out "$GEMMRL_OUT/serving_table.md" | tail -n 12
  fi
  if [[ $stages == *example* ]]; then
    for m in ${SERVE_TOKENS:-16 32}; do
      timeout "${SERVE_EXAMPLE_S:-150}" python3 examples/transformer_block.py --tokens "$m" --library "$slib" \
        --out "$GEMMRL_OUT" 2>&1 | tail -n 7
    done
  fi
fi

if [ "${FAMILIES:-0}" = 1 ]; then
  stages=${FAMILIES_STAGES:-compile,select,remeasure}
  shapes_args=${FAMILIES_SHAPES_ARGS:---grid cuda-l2 --sample 100 --seed 1}
  tag=${FAMILIES_TAG:-grid100s1}
  csel="$GEMMRL_OUT/${gpu}_${tag}_cutlass-select_graph-cold_${day}.csv"
  crem="$GEMMRL_OUT/${gpu}_${tag}_cutlass-triton-selected-remeasure_graph-cold_${day}.csv"
  tsel=${FAMILIES_TRITON_SEL:-${triton_sel_out:-benchmarks/results/h100/h100_decode-grid120_triton-select-top16-explore8-tn-nn_2026-11-22.csv.gz}}
  if [ -n "${CSEL_CSV:-}" ] && [ -f "$CSEL_CSV" ]; then  # a committed selection may be stored gzipped
    if [[ $CSEL_CSV == *.gz ]]; then gunzip -c "$CSEL_CSV" >"$csel"; else cp "$CSEL_CSV" "$csel"; fi
  fi
  if [ -n "${CREM_CSV:-}" ] && [ -f "$CREM_CSV" ]; then cp "$CREM_CSV" "$crem"; fi
  if [[ $stages == *compile* ]]; then
    timeout "${FAMILIES_COMPILE_S:-240}" python3 benchmarks/acceptance/compile_throughput.py --jobs "$(nproc)" --out "$GEMMRL_OUT" \
      2>"$GEMMRL_OUT/compile_throughput.log" | tail -n 1
  fi
  if [[ $stages == *select* ]]; then
    # shellcheck disable=SC2086
    timeout "${FAMILIES_SELECT_S:-300}" python3 -m gemmrl.cli select --family cutlass $shapes_args --layouts tn \
      --protocol graph,cold ${FAMILIES_SELECT_ARGS:-} --no-progress --out "$csel" >"$GEMMRL_OUT/cutlass_select.log" 2>&1
    echo "cutlass selection: exit $? ($(grep -c . "$csel" 2>/dev/null) lines)"
    grep -E "^screen:|Error" "$GEMMRL_OUT/cutlass_select.log" | head -5
  fi
  if [[ $stages == *remeasure* ]] && [ -n "${FAMILIES_AHEAD:-}" ]; then
    # only the shapes the screen puts near an earlier pass's vendor_best (the CUTLASS vendor-cells run: half the re-measure, every win kept)
    # shellcheck disable=SC2086
    if python3 benchmarks/acceptance/screen_ahead.py "$csel" --against $FAMILIES_AHEAD --min "${FAMILIES_AHEAD_MIN:-0.98}" \
        --out "$GEMMRL_OUT/${tag}_ahead.txt"; then
      shapes_args="--shapes $GEMMRL_OUT/${tag}_ahead.txt"
    else
      echo "FAMILIES_AHEAD: no shapes file written; the re-measure covers every screened shape"
    fi
  fi
  if [[ $stages == *remeasure* ]]; then
    # shellcheck disable=SC2086
    csels=${FAMILIES_CUTLASS_SEL:-$csel}
    timeout "${FAMILIES_REMEASURE_S:-420}" python3 -m gemmrl.cli bench $shapes_args --triton-from $tsel \
      --cutlass-from $csels --protocol graph,cold ${FAMILIES_REMEASURE_ARGS:-} --no-progress --out "$crem" \
      >"$GEMMRL_OUT/cutlass_remeasure.log" 2>&1
    echo "re-measure (vendor + triton-sel + cutlass-sel): exit $? ($(grep -c . "$crem" 2>/dev/null) lines)"
    python3 benchmarks/acceptance/family_table.py "$crem" --triton-select $tsel --cutlass-select $csels \
      --md "$GEMMRL_OUT/${gpu}_${tag}_family-table_${day}.md" | tail -n 14
  fi
fi

if [ "${LOOP:-0}" = 1 ]; then
  stages=${LOOP_STAGES:-sweep,tune,remeasure}
  shapes=${LOOP_SHAPES:-benchmarks/shapes/held50_grid_seed2.txt}
  tag=${LOOP_TAG:-held50s2}
  loop_tsel="$GEMMRL_OUT/${gpu}_${tag}_triton-select-top16-explore8-tn-nn_${day}.csv"
  loop_csel="$GEMMRL_OUT/${gpu}_${tag}_cutlass-select_graph-cold_${day}.csv"
  loop_rows="$GEMMRL_OUT/${gpu}_${tag}_tune-rl-rows_graph-cold_${day}.csv"
  loop_sum="$GEMMRL_OUT/${gpu}_${tag}_tune-rl-outcomes_${day}.csv"
  loop_proto=${LOOP_PROTOCOL:-graph,cold}  # (the file's name says what it holds: an offline pass is not a graph-cold one)
  loop_rem="$GEMMRL_OUT/${gpu}_${tag}_tuned-remeasure_${loop_proto//,/-}_${day}.csv"
  loop_shapes=${LOOP_SHAPES_ARGS:---shapes $shapes}  # e.g. "--grid cuda-l2 --part 1/5" (tag grid1000-part1of5)
  loop_trials="$GEMMRL_OUT/trials.sqlite"
  loop_policy="$GEMMRL_OUT/policy.json"
  # carried in: earlier files of this run (LOOP_TRIALS, the trials store a cut-off tune resumes from; LOOP_POLICY, the
  # policy the last chunk left), each may be stored gzipped
  for v in LOOP_TSEL_CSV:loop_tsel LOOP_CSEL_CSV:loop_csel LOOP_ROWS_CSV:loop_rows LOOP_REM_CSV:loop_rem LOOP_TRIALS:loop_trials LOOP_POLICY:loop_policy; do
    src=${v%%:*}; dst=${v##*:}
    if [ -n "${!src:-}" ] && [ -f "${!src}" ]; then
      if [[ ${!src} == *.gz ]]; then gunzip -c "${!src}" >"${!dst}"; else cp "${!src}" "${!dst}"; fi
    fi
  done
  if [[ $stages == *sweep* ]]; then
    # shellcheck disable=SC2086
    timeout "${LOOP_TSEL_S:-300}" python3 -m gemmrl.cli select $loop_shapes --top 16 --explore 8 \
      --layouts tn,nn --protocol graph,cold --no-progress --out "$loop_tsel" >"$GEMMRL_OUT/loop_triton_select.log" 2>&1
    echo "sweep triton: exit $? ($(grep -c . "$loop_tsel" 2>/dev/null) lines)"
    # shellcheck disable=SC2086
    timeout "${LOOP_CSEL_S:-240}" python3 -m gemmrl.cli select --family cutlass $loop_shapes --layouts tn \
      --protocol graph,cold --no-progress --out "$loop_csel" >"$GEMMRL_OUT/loop_cutlass_select.log" 2>&1
    echo "sweep cutlass: exit $? ($(grep -c . "$loop_csel" 2>/dev/null) lines)"
  fi
  if [[ $stages == *tune* ]] && [ -n "${LOOP_PARTS:-}" ]; then
    # several parts of the 1000-shape grid in one call (e.g. LOOP_PARTS="1/5 2/5 3/5"), one run each
    # (grid1000-partKofN), LOOP_TUNE_MIN of tuning and LOOP_TUNE_S at most per part, one trials store and policy
    # carried from part to part; rows and outcomes are exported afterwards with gemmrl trials export
    # LOOP_TUNE_END_S (seconds after this script started) caps the parts together: each part's wall budget is
    # the smaller of LOOP_TUNE_MIN and what is left before it (a part with under a minute left is not started)
    for part in $LOOP_PARTS; do
      ptag="grid1000-part${part%/*}of${part#*/}"
      tmin=${LOOP_TUNE_MIN:-4}; tlim=${LOOP_TUNE_S:-300}
      if [ -n "${LOOP_TUNE_END_S:-}" ]; then
        left=$((LOOP_TUNE_END_S - SECONDS))
        if [ "$left" -lt 60 ]; then echo "tune $ptag: not started ($left s left before LOOP_TUNE_END_S)"; continue; fi
        tmin=$(python3 -c "print(round(min($tmin, ($left - 15) / 60), 2))"); [ "$tlim" -gt "$left" ] && tlim=$left
      fi
      # shellcheck disable=SC2086
      timeout "$tlim" python3 -m gemmrl.cli tune --grid cuda-l2 --part "$part" --proposer rl \
        --group "${LOOP_GROUP:-4}" --rounds "${LOOP_ROUNDS:-1}" ${LOOP_TUNE_ARGS:-} --run "$ptag" --resume --trials "$loop_trials" \
        --policy "$loop_policy" --baselines "${LOOP_BASELINES:-cublas_tn,cublas_nn,cublaslt_heuristic_tn,cublaslt_heuristic_nn,torch}" \
        --budget-wall-minutes "$tmin" --no-progress >"$GEMMRL_OUT/loop_tune_${ptag}.log" 2>&1
      echo "tune $ptag: exit $?"; grep -E "^tune: [0-9]+ groups|Error" "$GEMMRL_OUT/loop_tune_${ptag}.log" | tail -n 2
    done
  elif [[ $stages == *tune* ]]; then
    # shellcheck disable=SC2086
    timeout "${LOOP_TUNE_S:-300}" python3 -m gemmrl.cli tune $loop_shapes --proposer rl \
      --group "${LOOP_GROUP:-4}" --rounds "${LOOP_ROUNDS:-1}" --run "$tag" --resume \
      --trials "$loop_trials" --policy "$loop_policy" --summary-out "$loop_sum" \
      --rows-out "$loop_rows" --baselines "${LOOP_BASELINES:-cublas_tn,cublas_nn,cublaslt_heuristic_tn,cublaslt_heuristic_nn,torch}" \
      --budget-wall-minutes "${LOOP_TUNE_MIN:-4}" --no-progress >"$GEMMRL_OUT/loop_tune.log" 2>&1
    echo "tune: exit $?"; grep -E "^tune:|Error" "$GEMMRL_OUT/loop_tune.log" | tail -n 4
  fi
  if [[ $stages == *tune* ]]; then
    # one file for the trials store (a killed run leaves its last writes in the WAL), and only 8 files come back
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" \
      "$loop_trials" && rm -f "$loop_trials"-wal "$loop_trials"-shm
    # and gzipped: a file over 16 MiB does not come back (the first grid tune lost part 3's first tune that way)
    gzip -f "$loop_trials" && echo "trials store: $(du -h "$loop_trials.gz" | cut -f1) gzipped"
  fi
  if [[ $stages == *remeasure* ]]; then
    # what is re-measured: the winners of LOOP_FROM (tune rows CSVs, .gz ok; default the tune stage's rows), or
    # with LOOP_LIBRARY=FILE `gemmrl` served from that library (then LOOP_FROM is not used)
    loop_from=${LOOP_FROM:-$loop_rows}
    if [ -n "${LOOP_LIBRARY:-}" ]; then loop_what="--library $LOOP_LIBRARY"
    else loop_what="--triton-from $loop_from --cutlass-from $loop_from"; fi
    nsh=${LOOP_SHARDS:-1}
    [ "$nsh" = gpus ] && nsh=$(nvidia-smi -L | wc -l)
    if [ "$nsh" -le 1 ] && [ -z "${LOOP_REM_DIR:-}" ]; then  # (with LOOP_REM_DIR one GPU is shard 0 of 1, resumable)
      # shellcheck disable=SC2086
      timeout "${LOOP_REMEASURE_S:-300}" python3 -m gemmrl.cli bench $loop_shapes $loop_what \
        --protocol "${LOOP_PROTOCOL:-graph,cold}" ${LOOP_BENCH_ARGS:-} --no-progress --out "$loop_rem" \
        >"$GEMMRL_OUT/loop_remeasure.log" 2>&1
      echo "re-measure: exit $? ($(grep -c . "$loop_rem" 2>/dev/null) lines)"
    else
      # one bench per GPU (LOOP_SHARDS=N or gpus), shard i of the shapes (every N-th, so each is a like mix) on
      # GPU i (the only one it sees), each to its own CSV (resumed when LOOP_REM_DIR carries the earlier shards in)
      # shellcheck disable=SC2086
      # (a shard file holds M_N_K only: the dtype and accumulator LOOP_SHAPES_ARGS named go to every shard's bench)
      python3 -c "import sys; from gemmrl.cli.main import build_parser; from gemmrl.cli.common import problems_from
a = build_parser().parse_args(['bench'] + sys.argv[2:]); ps, _ = problems_from(a); n = int(sys.argv[1])
for i in range(n):
    open(f'$GEMMRL_OUT/shard{i}.txt', 'w').write(''.join(p.mnk + chr(10) for p in ps[i::n]))
open('$GEMMRL_OUT/shard_args.txt', 'w').write(f'--dtype {a.dtype} --acc {a.acc}')
print(f'{len(ps)} shapes in {n} shards ({a.dtype}, acc {a.acc})')" "$nsh" $loop_shapes
      shard_args=$(cat "$GEMMRL_OUT/shard_args.txt" 2>/dev/null)
      for ((i = 0; i < nsh; i++)); do
        out="${loop_rem%.csv}_shard${i}of${nsh}.csv"
        if [ -n "${LOOP_REM_DIR:-}" ]; then
          # shard i's earlier CSV: any one file named *_shardIofN[-partial].csv[.gz] (another day's name resumes too)
          mapfile -t prev < <(ls "$LOOP_REM_DIR"/*_shard${i}of${nsh}.csv "$LOOP_REM_DIR"/*_shard${i}of${nsh}-partial.csv \
            "$LOOP_REM_DIR"/*_shard${i}of${nsh}.csv.gz "$LOOP_REM_DIR"/*_shard${i}of${nsh}-partial.csv.gz 2>/dev/null)
          if [ "${#prev[@]}" -gt 1 ]; then echo "LOOP_REM_DIR: ${#prev[@]} files for shard $i of $nsh (${prev[*]}); keep one"; exit 2
          elif [ "${#prev[@]}" = 1 ] && [[ ${prev[0]} == *.gz ]]; then gunzip -c "${prev[0]}" >"$out"
          elif [ "${#prev[@]}" = 1 ]; then cp "${prev[0]}" "$out"; fi
          [ "${#prev[@]}" = 1 ] && echo "shard $i of $nsh resumes $(basename "${prev[0]}") ($(grep -c . "$out") lines)"
        fi
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=$i timeout "${LOOP_REMEASURE_S:-300}" python3 -m gemmrl.cli bench \
          --shapes "$GEMMRL_OUT/shard$i.txt" $shard_args $loop_what --protocol "${LOOP_PROTOCOL:-graph,cold}" ${LOOP_BENCH_ARGS:-} \
          --no-progress --out "$out" >"$GEMMRL_OUT/loop_remeasure_shard$i.log" 2>&1 &
      done
      wait
      rm -f "$GEMMRL_OUT"/shard*.txt "$GEMMRL_OUT"/shard_args.txt
      for ((i = 0; i < nsh; i++)); do
        out="${loop_rem%.csv}_shard${i}of${nsh}.csv"
        echo "re-measure shard $i of $nsh: $(grep -c . "$out" 2>/dev/null) lines, $(cut -d, -f1 "$out" 2>/dev/null | sort -u | grep -c _) shapes"
      done
    fi
  fi
fi

if [ "${DASK:-0}" = 1 ]; then  # the distributed bar: one tuning chunk through Dask on 1 GPU, then 2 (needs 2 GPUs)
  timeout "${DASK_S:-480}" python3 benchmarks/acceptance/dask_scaling.py --shapes "${DASK_SHAPES:-benchmarks/shapes/held50_grid_seed2.txt}" \
    --n "${DASK_N:-32}" --out "$GEMMRL_OUT/dask" >"$GEMMRL_OUT/dask_scaling.log" 2>&1
  echo "dask scaling: exit $?"; grep -vE "^\s*$|distributed\." "$GEMMRL_OUT/dask_scaling.log" | tail -n 9
  ( cd "$GEMMRL_OUT" && rm -rf dask/triton_* && tar czf dask.tgz dask && rm -rf dask )
fi

if [ "${ADVERSARIAL:-0}" = 1 ]; then
  stages=${ADVERSARIAL_STAGES:-adversarial,falserej,faults}
  if [[ $stages == *adversarial* ]]; then
    GEMMRL_ADVERSARIAL_CSV="$GEMMRL_OUT/${gpu}_adversarial_${day}.csv" timeout "${ADVERSARIAL_ADV_S:-300}" \
      python3 -m pytest -q -p no:cacheprovider tests/adversarial/test_adversarial.py >"$GEMMRL_OUT/adversarial_adversarial.log" 2>&1
    echo "adversarial suite: exit $? ; $(tail -n 1 "$GEMMRL_OUT/adversarial_adversarial.log")"
    # the battery's gpu tier (its interpreter tier cannot run there: numpy 2.5 breaks Triton 3.6's interpreter)
    timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu ${ADVERSARIAL_GPU_TESTS:-tests/test_verify.py} \
      >>"$GEMMRL_OUT/adversarial_adversarial.log" 2>&1
    echo "battery gpu tests: exit $? ; $(tail -n 1 "$GEMMRL_OUT/adversarial_adversarial.log")"
    grep -E "^(FAILED|ERROR)" "$GEMMRL_OUT/adversarial_adversarial.log" | head -10
    [ -f "$GEMMRL_OUT/${gpu}_adversarial_${day}.csv" ] && python3 benchmarks/acceptance/adversarial_table.py \
      "${gpu}=$GEMMRL_OUT/${gpu}_adversarial_${day}.csv" | tail -n 3
  fi
  if [[ $stages == *falserej* ]]; then
    timeout "${ADVERSARIAL_FR_S:-200}" python3 benchmarks/acceptance/false_rejections.py --out "$GEMMRL_OUT" --seeds 100 \
      --shapes "${ADVERSARIAL_FR_SHAPES:-benchmarks/shapes/false_rejection30.txt}" --max-seconds "${ADVERSARIAL_FR_BUDGET:-150}" \
      >"$GEMMRL_OUT/adversarial_false_rejections.log" 2>&1
    echo "false rejections: exit $?"; tail -n 8 "$GEMMRL_OUT/adversarial_false_rejections.log"
  fi
  if [[ $stages == *faults* ]]; then
    # shellcheck disable=SC2086
    timeout "${ADVERSARIAL_FAULTS_S:-300}" python3 benchmarks/acceptance/fault_survival.py --device cuda --out "$GEMMRL_OUT/faults" \
      ${FAULTS_ARGS:-} >"$GEMMRL_OUT/adversarial_fault_survival.log" 2>&1
    echo "fault survival: exit $?"; grep -v "^\s*$" "$GEMMRL_OUT/adversarial_fault_survival.log" | tail -n 16
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" \
      "$GEMMRL_OUT/faults/trials.sqlite" 2>/dev/null; rm -f "$GEMMRL_OUT"/faults/trials.sqlite-*
    ( cd "$GEMMRL_OUT" && tar czf faults.tgz faults && rm -rf faults )
  fi
fi

if [ "${HEADROOM:-0}" = 1 ]; then
  hshapes=${HEADROOM_SHAPES:-benchmarks/shapes/decode-grid120.txt}
  hcsv="$GEMMRL_OUT/${gpu}_headroom_$(basename "$hshapes" .txt)_${HEADROOM_PROTOCOL:-graph,cold}_${day}.csv"
  hcsv=${hcsv//,/-}
  if [ -n "${HEADROOM_CSV:-}" ] && [ -f "$HEADROOM_CSV" ]; then cp "$HEADROOM_CSV" "$hcsv"; fi
  if [ "${HEADROOM_SKIP_SHAPES:-0}" != 1 ]; then
    # shellcheck disable=SC2086
    timeout "${HEADROOM_S:-300}" python3 -m gemmrl.cli headroom --shapes "$hshapes" --protocol "${HEADROOM_PROTOCOL:-graph,cold}" \
      ${HEADROOM_ARGS:---quick} --out "$hcsv" --no-progress >"$GEMMRL_OUT/headroom.log" 2>&1
    echo "headroom $(basename "$hshapes"): exit $?"; tail -n 12 "$GEMMRL_OUT/headroom.log"
  fi
  if [ "${HEADROOM_GRID:-0}" = 1 ]; then
    gcsv="$GEMMRL_OUT/${gpu}_headroom_grid1000_cold-quick_${day}.csv"
    if [ -n "${HEADROOM_GRID_CSV:-}" ] && [ -f "$HEADROOM_GRID_CSV" ]; then cp "$HEADROOM_GRID_CSV" "$gcsv"; fi
    timeout "${HEADROOM_GRID_S:-300}" python3 -m gemmrl.cli headroom --grid cuda-l2 --protocol cold --quick \
      --out "$gcsv" --no-progress >"$GEMMRL_OUT/headroom_grid.log" 2>&1
    echo "headroom grid: exit $? ; $(($(wc -l <"$gcsv") - 1)) rows"; tail -n 8 "$GEMMRL_OUT/headroom_grid.log"
  fi
fi

if [ -n "${CUDA_SOURCE:-}" ]; then
  cshapes=${CUDA_SOURCE_SHAPES:-benchmarks/shapes/graph_worst6.txt}
  ccsv="$GEMMRL_OUT/${gpu}_$(basename "$cshapes" .txt)_$(basename "$CUDA_SOURCE" .cu)_sandbox-graph-cold_${day}.csv"
  if [ -n "${CUDA_SOURCE_CSV:-}" ] && [ -f "$CUDA_SOURCE_CSV" ]; then cp "$CUDA_SOURCE_CSV" "$ccsv"; fi
  timeout "${CUDA_SOURCE_S:-300}" python3 -m gemmrl.cli bench --cuda-source "$CUDA_SOURCE" --declare "${CUDA_SOURCE_DECLARE:-K%8}" \
    --shapes "$cshapes" --protocol graph,cold --no-progress --out "$ccsv" >"$GEMMRL_OUT/cuda_source.log" 2>&1
  echo "cuda source $(basename "$CUDA_SOURCE"): exit $?"; tail -n 30 "$GEMMRL_OUT/cuda_source.log"
fi

# a family that screens its own configs from one build per dtype (wgmma, tiny): select, then re-measure
# own_family FAMILY SHAPES STAGES SELECT_S REMEASURE_S WINNERS EXTRA SEL_CSV REM_CSV
own_family() {
  local fam=$1 fshapes=$2 stages=$3 ftag fsel frem
  ftag=$(basename "$fshapes" .txt)
  fsel="$GEMMRL_OUT/${gpu}_${ftag}_${fam}-select_graph-cold_${day}.csv"
  frem="$GEMMRL_OUT/${gpu}_${ftag}_${fam}-selected-remeasure_graph-cold_${day}.csv"
  if [ -n "$8" ] && [ -f "$8" ]; then cp "$8" "$fsel"; fi
  if [ -n "$9" ] && [ -f "$9" ]; then cp "$9" "$frem"; fi
  if [[ $stages == *select* ]]; then
    timeout "$4" python3 -m gemmrl.cli select --family "$fam" --shapes "$fshapes" --layouts tn \
      --protocol graph,cold --no-progress --out "$fsel" >"$GEMMRL_OUT/${fam}_select.log" 2>&1
    echo "$fam selection: exit $? ($(grep -c . "$fsel" 2>/dev/null) lines)"
    grep -E "^screen:|Error" "$GEMMRL_OUT/${fam}_select.log" | head -5
  fi
  if [ "$6" = 1 ] && [ -f "$fsel" ]; then  # re-measure only where the screen had the family ahead
    python3 -c "import sys; from gemmrl.results import read_rows; from gemmrl.search.screen import selection_table
w = sorted({t['mnk'] for t in selection_table(read_rows([sys.argv[1]])) if t['ratio'] > 1.0})
open(sys.argv[2], 'w').write('# shapes where the screen beat its best reference, in graph or cold\\n' + ''.join(m + '\\n' for m in w))
print(f'screen winners: {len(w)}: {\" \".join(w)}')" "$fsel" "$GEMMRL_OUT/${fam}_winners.txt"
    fshapes="$GEMMRL_OUT/${fam}_winners.txt"
  fi
  if [[ $stages == *remeasure* ]] && grep -q "^[0-9]" "$fshapes"; then
    # shellcheck disable=SC2086
    timeout "$5" python3 -m gemmrl.cli bench --shapes "$fshapes" --"$fam"-from "$fsel" \
      $7 --protocol graph,cold --no-progress --out "$frem" >"$GEMMRL_OUT/${fam}_remeasure.log" 2>&1
    echo "$fam re-measure: exit $? ($(grep -c . "$frem" 2>/dev/null) lines)"
    tail -n 25 "$GEMMRL_OUT/${fam}_remeasure.log"
  fi
}

if [ "${WGMMA:-0}" = 1 ]; then
  own_family wgmma "${WGMMA_SHAPES:-benchmarks/shapes/small72.txt}" "${WGMMA_STAGES:-select,remeasure}" \
    "${WGMMA_SELECT_S:-300}" "${WGMMA_REMEASURE_S:-300}" "${WGMMA_WINNERS:-0}" "${WGMMA_EXTRA:-}" "${WSEL_CSV:-}" \
    "${WREM_CSV:-}"
fi

if [ "${TINY:-0}" = 1 ]; then
  own_family tiny "${TINY_SHAPES:-benchmarks/shapes/tiny_first24.txt}" "${TINY_STAGES:-select,remeasure}" \
    "${TINY_SELECT_S:-300}" "${TINY_REMEASURE_S:-300}" "${TINY_WINNERS:-0}" "${TINY_EXTRA:-}" "${TSEL_CSV:-}" \
    "${TREM_CSV:-}"
fi

if [ -n "${MERGE_LIB:-}" ]; then  # the selection's winners into a copy of a grid library, then their measure pass
  mtag=${MERGE_TAG:-merge}
  msel=${MERGE_SELECT:-$GEMMRL_OUT/${gpu}_$(basename "${TINY_SHAPES:-benchmarks/shapes/tiny_first24.txt}" .txt)_tiny-select_graph-cold_${day}.csv}
  mlib="$GEMMRL_OUT/${gpu}_grid1000_library_${mtag}_${day}.json.gz"
  mshapes="$GEMMRL_OUT/${mtag}_measure.txt"
  python3 benchmarks/acceptance/library_merge_rows.py screened "$msel" --splice-md "${MERGE_SPLICE:?MERGE_SPLICE=<splice .md>}" \
    --margin "${MERGE_MARGIN:-1.04}" --out "/tmp/${mtag}_rows.csv" --shapes-out "$mshapes" >"$GEMMRL_OUT/${mtag}_merge.log" 2>&1
  echo "merge rows: exit $?"; tail -n 3 "$GEMMRL_OUT/${mtag}_merge.log"
  if [ -s "$mshapes" ]; then
    if cp "$MERGE_LIB" "$mlib" && python3 -m gemmrl.cli lib build --generated-only --no-buckets "/tmp/${mtag}_rows.csv" \
        --out "$mlib" --trials "/tmp/${mtag}_trials.sqlite" >>"$GEMMRL_OUT/${mtag}_merge.log" 2>&1; then
      tail -n 2 "$GEMMRL_OUT/${mtag}_merge.log"
      mrows="$GEMMRL_OUT/${gpu}_grid1000-${mtag}_library_graph-cold-quick_${GEMMRL_GIT_SHA}_${day}.csv"
      timeout "${MERGE_S:-240}" python3 -m gemmrl.cli bench --shapes "$mshapes" --library "$mlib" --protocol graph,cold \
        --timing quick --no-progress --out "$mrows" >"$GEMMRL_OUT/${mtag}_measure.log" 2>&1
      echo "merge measure, graph and cold: exit $? ($(grep -c . "$mrows" 2>/dev/null) lines)"
      timeout "${MERGE_S:-240}" python3 -m gemmrl.cli bench --shapes "$mshapes" --library "$mlib" --protocol offline \
        --baselines cublaslt_autotuned_tn,cublaslt_autotuned_nn --warmup-seconds 0.1 --benchmark-seconds 0.5 \
        --no-progress --out "${mrows%_graph-cold-quick_*}-cublaslt-autotuned_offline_${GEMMRL_GIT_SHA}_${day}.csv" \
        >>"$GEMMRL_OUT/${mtag}_measure.log" 2>&1
      echo "merge measure, offline: exit $?"; tail -n 6 "$GEMMRL_OUT/${mtag}_measure.log"
    else
      echo "merge: the library build failed, nothing measured"; tail -n 3 "$GEMMRL_OUT/${mtag}_merge.log"
    fi
  fi
fi

if [ "${EFFREM:-0}" = 1 ]; then
  # shellcheck disable=SC2206
  etest=(${EFFREM_TEST:-benchmarks/results/h100/h100_held50s2_triton-select-top16-explore8-tn-nn_2026-11-23.csv.gz benchmarks/results/h100/h100_held50s2_cutlass-select_graph-cold_2026-11-23.csv.gz})
  # shellcheck disable=SC2206
  epol=(${EFFREM_POLICIES:-src/gemmrl/policies/h100.json})
  eargs=(--test "${etest[@]}" --judge "${epol[@]}" --budget "${EFFREM_BUDGET:-arms:4,gpu:0.15}")
  erows="$GEMMRL_OUT/${gpu}_policy-efficiency-remeasured_held50s2_${EFFREM_BUDGET:-arms:4,gpu:0.15}_${day}.csv"
  erows=${erows//:/}; erows=${erows//,/-}
  if [ -n "${EFFREM_CSV:-}" ] && [ -f "$EFFREM_CSV" ]; then
    if [[ $EFFREM_CSV == *.gz ]]; then gunzip -c "$EFFREM_CSV" >"$erows"; else cp "$EFFREM_CSV" "$erows"; fi
  fi
  python3 benchmarks/acceptance/efficiency_remeasure.py "${eargs[@]}" --plan
  timeout "${EFFREM_S:-300}" python3 benchmarks/acceptance/efficiency_remeasure.py "${eargs[@]}" --measure "$erows" \
    --repeats "${EFFREM_REPEATS:-3}" >"$GEMMRL_OUT/effrem.log" 2>&1
  echo "efficiency re-measure: exit $? ($(grep -c . "$erows" 2>/dev/null) lines)"; tail -n 3 "$GEMMRL_OUT/effrem.log"
  python3 benchmarks/acceptance/efficiency_remeasure.py "${eargs[@]}" --report "$erows" --csv "${erows%.csv}_shares.csv"
fi

for t in "${tables[@]}"; do python3 benchmarks/acceptance/vendor_paths_table.py "$t"; done
# at most 8 files come back from the GPU machine: logs and markdown travel as one archive
# (a second run in the same call, into the same $GEMMRL_OUT, writes logs2.tgz: it must not overwrite the first's logs)
( cd "$GEMMRL_OUT" && shopt -s nullglob && f=(./*.log ./*.md) && [ ${#f[@]} -gt 0 ] && n=logs.tgz && i=1 \
  && while [ -e "$n" ]; do i=$((i + 1)); n=logs$i.tgz; done && tar czf "$n" "${f[@]}" && rm -f "${f[@]}" )
