# shellcheck shell=bash
# The environment every GPU run of this tree sets up first (sourced by gpu_run.sh, gpu_test_tier.sh and the other GPU runs here): the package
# installed from the tree, the CUTLASS headers (.whl/nvidia_cutlass-*.whl) and prebuilt objects (.carry/gemmrl_cache
# or .carry/pack/cache.tgz) that travel with it, one cache and output folder, the machine printed once. A caller that
# has sourced it already and starts several runs at once sets GEMMRL_ENV_READY=1: they then share its set-up.
export GEMMRL_OUT=${GEMMRL_OUT:-${OUT:-/tmp/gemmrl_out}}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export GEMMRL_CACHE_DIR=${GEMMRL_CACHE_DIR:-/tmp/gemmrl_cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
mkdir -p "$GEMMRL_OUT"
: "${GEMMRL_GIT_SHA:=unknown}"
export GEMMRL_GIT_SHA

if [ "${GEMMRL_ENV_READY:-0}" = 1 ]; then  # set up already by the caller (runs sharing one machine at once)
  [ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site
  return 0 2>/dev/null || exit 0
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version,temperature.gpu,power.draw --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "(pip install -e . failed; using PYTHONPATH=src)"
if ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then  # CUTLASS headers for the CUTLASS family and imported kernels
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nvidia_cutlass-*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ -d .carry/gemmrl_cache ]; then mkdir -p "$GEMMRL_CACHE_DIR" && cp -r .carry/gemmrl_cache/. "$GEMMRL_CACHE_DIR"/; fi
if [ -f .carry/pack/cache.tgz ]; then  # the same, packed (the tree that travels is limited to 64 MiB)
  mkdir -p "$GEMMRL_CACHE_DIR" && tar xzf .carry/pack/cache.tgz -C "$GEMMRL_CACHE_DIR" --strip-components=1
fi
if ls .whl/dask/*.whl >/dev/null 2>&1; then  # Dask distributed, pure-Python wheels carried in
  python3 -m pip install -q --no-index --find-links .whl/dask distributed >/dev/null 2>&1 || echo "(dask install failed)"
fi
echo "nvcc $(nvcc --version | grep -o 'V[0-9.]*'), $(nproc) CPUs, $(nvidia-smi -L | wc -l) GPUs"
