#!/usr/bin/env bash
# Hugging Face transformers generation on the GPU in front of you: examples/hf_generate.py on Llama-3-8B's config
# (random weights, built on the GPU in bf16), stock and gemmrl.patch, eager and compiled (generate's own compile:
# decode steps in CUDA graphs, mode="reduce-overhead", a graph per batch; prefill eager),
# generate with a static cache at batch 1, 8 and 32 and prompts of 512 and 2048 tokens: prefill and decode tokens/s,
# peak memory, tokens equal, and what serves each GEMM (gemmrl.served_by), as CSVs under $GEMMRL_OUT.
#   GEMMRL_GIT_SHA=$(git rev-parse HEAD) bash benchmarks/acceptance/gpu_hf_generate.sh                 (carry .whl/hf)
# The GPU machine reaches no registry: transformers (the pin, 5.24.0) installs from wheels carried in .whl/hf, made
# here with: pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#   --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/hf
#   transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.11.19
# (the image's huggingface_hub, typer, pyyaml, tqdm, packaging and numpy meet 5.24.0's needs). A call carries at most
# 64 MiB with the working tree, and the tree is over 50 MiB (committed results): the four wheels (18 MiB) no longer
# fit, nor transformers' alone (13 MiB). Without .whl/hf the image's transformers serves (5.17.0, with tokenizers,
# safetensors and regex, as the image was read on 2026-11-17); every row records the version that ran.
# Knobs: MODEL (llama-3-8b), DTYPE (bf16), BATCHES (1,8,32), PROMPTS (512,2048), NEW_TOKENS (32), WARMUP (2),
# REPEATS (3), MODES (all four: stock-eager,patched-eager,stock-compiled,patched-compiled), LAYERS (the preset's),
# LIBRARY (as-gpu: the package's H100 library relabelled for this GPU, as benchmarks/acceptance/gpu_anyshape.sh serves; default:
# the package's + the user's; empty: vendor paths only), RUN_S (the example's time limit, 540), EXTRA (more arguments).
# PATCH_CHECK=llama-3-8b,qwen2.5-7b,mixtral-8x7b first runs benchmarks/acceptance/hf_patch_check.py on those models
# (CHECK_DTYPES, fp16,bf16; CHECK_S, 300: its time limit): outputs, unpatch, state_dict and peak memory patched / stock.
# GENERATE=0 leaves the generate runs out.
# One call has 10 minutes: the eager grid (6 cells, REPEATS=5) with the patch check took 449 s on an H200, the compiled
# modes at BATCHES=1,8 PROMPTS=512 231 s (a decode compile per batch and mode, ~25-35 s each); split the grid, e.g.
#   MODES=stock-eager,patched-eager;  MODES=stock-compiled,patched-compiled BATCHES=32;  ... PROMPTS=2048
# each call's files are named by its modes, batches, prompts, sha and day. GEMMRL_GRAPH_RACE=cold passes through.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck shell=bash disable=SC1091
source benchmarks/acceptance/gpu_env.sh
SHA=${GEMMRL_GIT_SHA}
DAY=$(date -u +%F)
status=0
if ls .whl/hf/transformers-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --find-links .whl/hf "transformers==${TRANSFORMERS_VERSION:-5.24.0}" 2>&1 \
    | tail -3 || {
    echo "(pip install into the image failed: the carried wheels go to /tmp/site_hf, ahead on PYTHONPATH)"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_hf .whl/hf/*.whl \
      && export PYTHONPATH=/tmp/site_hf:$PYTHONPATH || status=1
  }
else
  echo "(no .whl/hf/transformers-*.whl carried: the image's transformers serves)"
fi
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
GPUTAG=$(echo "$GPU" | grep -oiE 'h100|h200|h20|b200|a100|l40s' | head -1 | tr '[:upper:]' '[:lower:]')
LIBARG=()
case ${LIBRARY:-as-gpu} in
  as-gpu)
    gemmrl lib export --library src/gemmrl/libraries/h100.json --gpu 'NVIDIA H100 80GB HBM3' --as-gpu "$GPU" \
      /tmp/served_library.json && LIBARG=(--library /tmp/served_library.json) || status=1
    LIBTAG=h100-models-library-as-${GPUTAG:-gpu};;
  empty)
    python3 -c "from gemmrl.library import Library; Library().save('/tmp/served_library.json')" \
      && LIBARG=(--library /tmp/served_library.json) || status=1
    LIBTAG=empty-library;;
  default) LIBTAG=default-library;;
  *) echo "LIBRARY=${LIBRARY}: use as-gpu, default or empty"; exit 2;;
esac
if [ -n "${PATCH_CHECK:-}" ]; then
  ctag=${GPUTAG:-gpu}_${LIBTAG}_${PATCH_CHECK//,/-}_${SHA:0:12}_${DAY}
  timeout "${CHECK_S:-300}" python3 benchmarks/acceptance/hf_patch_check.py --models "$PATCH_CHECK" \
    --dtypes "${CHECK_DTYPES:-fp16,bf16}" "${LIBARG[@]}" --out "$GEMMRL_OUT" --tag "$ctag" 2>&1 \
    | tee "$GEMMRL_OUT/hf_patch_${ctag}_log.txt"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
[ "${GENERATE:-1}" = 0 ] && { echo "sha=$SHA status=$status"; exit "$status"; }
MODES=${MODES:-stock-eager,patched-eager,stock-compiled,patched-compiled}
BATCHES=${BATCHES:-1,8,32}
PROMPTS=${PROMPTS:-512,2048}
KINDS=$(tr ',' '\n' <<<"$MODES" | sed 's/.*-//' | sort -u | paste -sd- -)
TAG=${GPUTAG:-gpu}_${LIBTAG}_${KINDS}_b${BATCHES//,/-}_p${PROMPTS//,/-}_${SHA:0:12}_${DAY}
extra=()
[ -n "${LAYERS:-}" ] && extra+=(--layers "$LAYERS")
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && extra+=(${EXTRA})
timeout "${RUN_S:-540}" python3 examples/hf_generate.py --model "${MODEL:-llama-3-8b}" --dtype "${DTYPE:-bf16}" \
  --batches "$BATCHES" --prompt-lens "$PROMPTS" --new-tokens "${NEW_TOKENS:-32}" --modes "$MODES" \
  --warmup "${WARMUP:-2}" --repeats "${REPEATS:-3}" --device cuda "${LIBARG[@]}" "${extra[@]}" \
  --out "$GEMMRL_OUT" --tag "$TAG" 2>&1 | tee "$GEMMRL_OUT/hf_generate_${MODEL:-llama-3-8b}_${DTYPE:-bf16}_${TAG}_log.txt" \
  || status=1
echo "sha=$SHA status=$status"
