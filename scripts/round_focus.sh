# Sourced by scripts/gpu_round.sh: a round that asks for a targeted stage skips the 60-shape sweep and the
# repeatability stage unless SWEEP=1 / REPEAT=1 (or SKIP_SWEEP=0 / SKIP_REPEAT=0) asks for them. Together they take
# ~570 of a call's 600 s and starve the stage that was asked for (the bf16 model-library run lost a call that way).
# Sets SKIP_SWEEP / SKIP_REPEAT (an explicit value is kept) and round_focus (the targeted stages, space-separated).
round_focus=""
for _v in PDL_PROBE COLD_ANATOMY PACE_PROBE FAMILIES LOOP ADVERSARIAL DASK HEADROOM WGMMA TINY EFFREM; do
  if [ "${!_v:-0}" = 1 ]; then round_focus+=" $_v"; fi
done
for _v in NCU_SPECS PROBE_SPECS TRITON_SHAPES SERVE_SHAPES CUDA_SOURCE MERGE_LIB GPU_TESTS PYTEST_K; do
  if [ -n "${!_v:-}" ]; then round_focus+=" $_v"; fi
done
round_focus=${round_focus# }
unset _v
if [ -n "$round_focus" ]; then
  if [ "${SWEEP:-0}" != 1 ]; then SKIP_SWEEP=${SKIP_SWEEP:-1}; fi
  if [ "${REPEAT:-0}" != 1 ]; then SKIP_REPEAT=${SKIP_REPEAT:-1}; fi
fi
