# Sourced by benchmarks/acceptance/gpu_run.sh: a run that asks for a targeted stage skips the 60-shape sweep and the
# repeatability stage unless SWEEP=1 / REPEAT=1 (or SKIP_SWEEP=0 / SKIP_REPEAT=0) asks for them. Together they take
# ~570 of a call's 600 s and starve the stage that was asked for (the bf16 model-library run lost a call that way).
# Sets SKIP_SWEEP / SKIP_REPEAT (an explicit value is kept) and targeted_stages (the targeted stages, space-separated).
targeted_stages=""
for _v in PDL_PROBE COLD_ANATOMY PACE_PROBE FAMILIES LOOP ADVERSARIAL DASK HEADROOM WGMMA TINY EFFREM; do
  if [ "${!_v:-0}" = 1 ]; then targeted_stages+=" $_v"; fi
done
for _v in NCU_SPECS PROBE_SPECS TRITON_SHAPES SERVE_SHAPES CUDA_SOURCE MERGE_LIB GPU_TESTS PYTEST_K; do
  if [ -n "${!_v:-}" ]; then targeted_stages+=" $_v"; fi
done
targeted_stages=${targeted_stages# }
unset _v
if [ -n "$targeted_stages" ]; then
  if [ "${SWEEP:-0}" != 1 ]; then SKIP_SWEEP=${SKIP_SWEEP:-1}; fi
  if [ "${REPEAT:-0}" != 1 ]; then SKIP_REPEAT=${SKIP_REPEAT:-1}; fi
fi
