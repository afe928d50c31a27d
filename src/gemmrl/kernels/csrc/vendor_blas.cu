// vendor_blas.cu - host-only C API over cuBLAS and cuBLASLt for gemmrl's vendor baselines.
//
// Built by gemmrl/kernels/vendor.py (nvcc -x c++, no device code) and loaded with ctypes.
//
// Problem: row-major C[M,N] = A[M,K] @ B, fp16 or bf16 in and out.
//   layout 'n' (tn = 0): B is row-major [K,N]
//   layout 't' (tn = 1): B is given as B^T row-major [N,K]
// cuBLAS is column-major, so every call computes C^T = op(B)^T-ish with the usual swap:
//   column-major C^T [N,M] = op(Bmem) [N,K] x Amem [K,M], where Amem is A row-major read as a
//   column-major K x M matrix (ld K), and Bmem is B row-major read as column-major N x K (ld N, op N)
//   or B^T row-major read as column-major K x N (ld K, op T).
// acc 0 = fp32 (CUBLAS_COMPUTE_32F, float alpha = 1, beta = 0; never the _FAST_ variants),
// acc 1 = fp16 (CUBLAS_COMPUTE_16F, half alpha/beta; fp16 data only).
//
// Resources: one context per device (cublasHandle_t, cublasLtHandle_t, one 32 MiB cudaMalloc
// workspace shared by both, also set on the cuBLAS handle with cublasSetWorkspace), made once.
// A "plan" holds everything a call needs (descriptors, heuristic results, scalars), so a call
// passes only the plan, three pointers and the stream. Every function returns a status int
// (0 = success); vb_status_string() turns it into a message.
//
// Differences from CUDA-L2's own baselines, on purpose: a real 32 MiB workspace on every path (their
// heuristic baseline's `20 * 1024 * 1024 * 1024` overflows int to 0 bytes; their autotuned one uses
// 20 GiB, their cuBLAS one cuBLAS's default pool); handles made once per device; the caller's stream
// (torch's current stream) rather than the legacy default stream; CUBLAS_GEMM_DEFAULT (their
// CUBLAS_GEMM_DEFAULT_TENSOR_OP is deprecated and equivalent).
//
// Threading: a context's cuBLAS handle remembers its stream; vb_run on GemmEx plans takes a mutex
// around "set stream + workspace, launch". The workspace is shared by all plans of a context, so two
// calls on different streams must not run concurrently on the GPU (the harness never does that).

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#define VB_API extern "C" __attribute__((visibility("default")))

// ---- statuses ----------------------------------------------------------------------------------
enum {
  VB_OK = 0,
  VB_ERR_ARG = -1,          // null pointer, bad dims, unknown dtype/acc/layout
  VB_ERR_BF16_ACC16 = -2,   // bf16 has no fp16-accumulate GEMM in cuBLAS
  VB_ERR_INDEX = -3,        // algorithm index out of range
  VB_ERR_NO_ALGO = -4,      // cublasLtMatmulAlgoGetHeuristic returned no algorithm
  VB_ERR_MISALIGNED = -5,   // an operand is less aligned than the plan was made for
  VB_ERR_KIND = -6,         // cuBLASLt-only call on a GemmEx plan
  VB_ERR_ALLOC = -7,        // host allocation failed
  VB_CUBLAS_BASE = 1000,    // 1000 + cublasStatus_t
  VB_CUDA_BASE = 2000,      // 2000 + cudaError_t
};

#define VB_CUBLAS(x)                                                  \
  do {                                                                \
    cublasStatus_t s_ = (x);                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) return VB_CUBLAS_BASE + (int)s_; \
  } while (0)
#define VB_CUDA(x)                                              \
  do {                                                          \
    cudaError_t e_ = (x);                                       \
    if (e_ != cudaSuccess) return VB_CUDA_BASE + (int)e_;       \
  } while (0)

static const size_t kWorkspaceBytes = 32ull << 20;  // 32 MiB, every path
static const int kMaxAlgos = 128;

// IEEE half bit patterns for the fp16-compute scalars (no cuda_fp16.h needed on the host).
static const uint16_t kHalfOne = 0x3C00, kHalfZero = 0x0000;
static const float kFloatOne = 1.0f, kFloatZero = 0.0f;

struct vb_ctx {
  int device;
  unsigned flags;
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  void* workspace;
  size_t workspace_bytes;
  cudaStream_t blas_stream;  // stream currently set on `blas`
  bool blas_stream_set;
  std::mutex mu;
};

enum { VB_KIND_GEMMEX = 0, VB_KIND_LT = 1 };
enum { VB_FLAG_STRICT_REDUCTION = 1 };  // no reduced-precision (output-type / in-place) split-K reductions

struct vb_plan {
  vb_ctx* ctx;
  int kind;
  // column-major problem: C^T[m=N, n=M] = op(Bmem)[m,k] * Amem[k,n]
  int m, n, k, ldb;
  cublasOperation_t opb;
  cudaDataType_t dt;
  cublasComputeType_t ct;
  const void* alpha;
  const void* beta;
  uintptr_t align_mask;  // pointer bits that must be zero (cuBLASLt plans)
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  int n_algos;
  int selected;
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
};

// ---- messages ------------------------------------------------------------------------------------
VB_API const char* vb_status_string(int status) {
  static thread_local char buf[512];
  switch (status) {
    case VB_OK: return "success";
    case VB_ERR_ARG: return "invalid argument (null pointer, dims < 1, or unknown dtype/acc/layout code)";
    case VB_ERR_BF16_ACC16:
      return "bf16 has no fp16-accumulate GEMM (CUBLAS_COMPUTE_16F takes fp16 data only); use acc='fp32' for bf16";
    case VB_ERR_INDEX: return "algorithm index out of range for this plan";
    case VB_ERR_NO_ALGO: return "cublasLtMatmulAlgoGetHeuristic found no algorithm for this problem";
    case VB_ERR_MISALIGNED:
      return "an operand pointer is less aligned than the cuBLASLt plan assumed; prepare the candidate on buffers "
             "aligned like the ones it is called with";
    case VB_ERR_KIND: return "this call needs a cuBLASLt plan, not a cublasGemmEx plan";
    case VB_ERR_ALLOC: return "host memory allocation failed";
    default: break;
  }
  if (status >= VB_CUDA_BASE) {
    cudaError_t e = (cudaError_t)(status - VB_CUDA_BASE);
    snprintf(buf, sizeof buf, "CUDA error %d %s: %s", (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
  } else if (status >= VB_CUBLAS_BASE) {
    cublasStatus_t s = (cublasStatus_t)(status - VB_CUBLAS_BASE);
    snprintf(buf, sizeof buf, "cuBLAS status %d %s: %s", (int)s, cublasGetStatusName(s), cublasGetStatusString(s));
  } else {
    snprintf(buf, sizeof buf, "unknown vendor_blas status %d", status);
  }
  return buf;
}

// ---- versions and where the libraries came from --------------------------------------------------
VB_API int vb_versions(size_t* lt_version, int* cublas_version, int* runtime_version, int* driver_version) {
  if (lt_version) *lt_version = cublasLtGetVersion();
  if (cublas_version) {
    int mj = 0, mn = 0, pl = 0;
    VB_CUBLAS(cublasGetProperty(MAJOR_VERSION, &mj));
    VB_CUBLAS(cublasGetProperty(MINOR_VERSION, &mn));
    VB_CUBLAS(cublasGetProperty(PATCH_LEVEL, &pl));
    *cublas_version = mj * 10000 + mn * 100 + pl;
  }
  if (runtime_version) VB_CUDA(cudaRuntimeGetVersion(runtime_version));
  if (driver_version) VB_CUDA(cudaDriverGetVersion(driver_version));
  return VB_OK;
}

// Path of the shared object that provides `sym` (which libcublasLt/libcublas this process uses).
static int path_of(const void* sym, char* buf, int len) {
  if (!buf || len < 1) return VB_ERR_ARG;
  Dl_info info;
  memset(&info, 0, sizeof info);
  if (!dladdr(sym, &info) || !info.dli_fname) {
    buf[0] = 0;
    return VB_OK;
  }
  snprintf(buf, (size_t)len, "%s", info.dli_fname);
  return VB_OK;
}
VB_API int vb_cublaslt_path(char* buf, int len) { return path_of((const void*)&cublasLtGetVersion, buf, len); }
VB_API int vb_cublas_path(char* buf, int len) { return path_of((const void*)&cublasGetProperty, buf, len); }

// ---- contexts ------------------------------------------------------------------------------------
VB_API int vb_ctx_create(int device, unsigned flags, vb_ctx** out) {
  if (!out || device < 0) return VB_ERR_ARG;
  *out = nullptr;
  int prev = 0;
  VB_CUDA(cudaGetDevice(&prev));
  VB_CUDA(cudaSetDevice(device));
  vb_ctx* c = new (std::nothrow) vb_ctx();
  if (!c) {
    cudaSetDevice(prev);
    return VB_ERR_ALLOC;
  }
  c->device = device;
  c->flags = flags;
  c->workspace_bytes = kWorkspaceBytes;
  int st = VB_OK;
  cublasStatus_t s;
  cudaError_t e;
  if ((s = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS) { st = VB_CUBLAS_BASE + (int)s; goto fail; }
  if ((s = cublasLtCreate(&c->lt)) != CUBLAS_STATUS_SUCCESS) { st = VB_CUBLAS_BASE + (int)s; goto fail; }
  if ((e = cudaMalloc(&c->workspace, c->workspace_bytes)) != cudaSuccess) { st = VB_CUDA_BASE + (int)e; goto fail; }
  {
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
    if (flags & VB_FLAG_STRICT_REDUCTION)
      mode = (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    if ((s = cublasSetMathMode(c->blas, mode)) != CUBLAS_STATUS_SUCCESS) { st = VB_CUBLAS_BASE + (int)s; goto fail; }
  }
  if ((s = cublasSetWorkspace(c->blas, c->workspace, c->workspace_bytes)) != CUBLAS_STATUS_SUCCESS) {
    st = VB_CUBLAS_BASE + (int)s;
    goto fail;
  }
  c->blas_stream = nullptr;
  c->blas_stream_set = false;  // the first vb_run sets the caller's stream (and the workspace again)
  cudaSetDevice(prev);
  *out = c;
  return VB_OK;
fail:
  if (c->workspace) cudaFree(c->workspace);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->blas) cublasDestroy(c->blas);
  delete c;
  cudaSetDevice(prev);
  return st;
}

VB_API int vb_ctx_destroy(vb_ctx* c) {
  if (!c) return VB_OK;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(c->device);
  cudaDeviceSynchronize();
  if (c->blas) cublasDestroy(c->blas);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->workspace) cudaFree(c->workspace);
  cudaSetDevice(prev);
  delete c;
  return VB_OK;
}

VB_API size_t vb_workspace_bytes(void) { return kWorkspaceBytes; }

// ---- plans ---------------------------------------------------------------------------------------
static int plan_init(vb_ctx* ctx, int dtype, int acc, int layout_tn, int M, int N, int K, vb_plan* p) {
  if (dtype == 1 && acc == 1) return VB_ERR_BF16_ACC16;
  if (!ctx || M < 1 || N < 1 || K < 1 || dtype < 0 || dtype > 1 || acc < 0 || acc > 1 || layout_tn < 0 ||
      layout_tn > 1)
    return VB_ERR_ARG;
  p->ctx = ctx;
  p->m = N;
  p->n = M;
  p->k = K;
  p->opb = layout_tn ? CUBLAS_OP_T : CUBLAS_OP_N;
  p->ldb = layout_tn ? K : N;
  p->dt = dtype == 0 ? CUDA_R_16F : CUDA_R_16BF;
  p->ct = acc == 0 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_16F;
  p->alpha = acc == 0 ? (const void*)&kFloatOne : (const void*)&kHalfOne;
  p->beta = acc == 0 ? (const void*)&kFloatZero : (const void*)&kHalfZero;
  p->align_mask = 0;
  p->n_algos = 0;
  p->selected = 0;
  return VB_OK;
}

VB_API int vb_plan_destroy(vb_plan* p) {
  if (!p) return VB_OK;
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  delete p;
  return VB_OK;
}

// A cublasGemmEx plan (CUBLAS_GEMM_DEFAULT).
VB_API int vb_gemmex_plan_create(vb_ctx* ctx, int dtype, int acc, int layout_tn, int M, int N, int K, vb_plan** out) {
  if (!out) return VB_ERR_ARG;
  *out = nullptr;
  vb_plan* p = new (std::nothrow) vb_plan();
  if (!p) return VB_ERR_ALLOC;
  int st = plan_init(ctx, dtype, acc, layout_tn, M, N, K, p);
  if (st != VB_OK) {
    delete p;
    return st;
  }
  p->kind = VB_KIND_GEMMEX;
  p->n_algos = 1;
  *out = p;
  return VB_OK;
}

// A cuBLASLt plan: matmul descriptor, layouts, and the heuristic's first `requested` algorithms for a
// 32 MiB workspace and operands aligned to `align_bytes` (a power of two, at most 256).
VB_API int vb_lt_plan_create(vb_ctx* ctx, int dtype, int acc, int layout_tn, int M, int N, int K, int requested,
                             int align_bytes, vb_plan** out) {
  if (!out || requested < 1 || align_bytes < 1 || align_bytes > 256 || (align_bytes & (align_bytes - 1))) return VB_ERR_ARG;
  *out = nullptr;
  if (requested > kMaxAlgos) requested = kMaxAlgos;
  vb_plan* p = new (std::nothrow) vb_plan();
  if (!p) return VB_ERR_ALLOC;
  int st = plan_init(ctx, dtype, acc, layout_tn, M, N, K, p);
  if (st != VB_OK) {
    delete p;
    return st;
  }
  p->kind = VB_KIND_LT;
  p->align_mask = (uintptr_t)(align_bytes - 1);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t s;
  const cudaDataType_t scale = p->ct == CUBLAS_COMPUTE_32F ? CUDA_R_32F : CUDA_R_16F;
  const cublasOperation_t opn = CUBLAS_OP_N;
  const uint64_t ws = ctx->workspace_bytes;
  const uint32_t align = (uint32_t)align_bytes;
  int returned = 0;
#define VB_LT(x)                                                           \
  do {                                                                     \
    if ((s = (x)) != CUBLAS_STATUS_SUCCESS) {                              \
      st = VB_CUBLAS_BASE + (int)s;                                        \
      goto fail;                                                           \
    }                                                                      \
  } while (0)
  VB_LT(cublasLtMatmulDescCreate(&p->desc, p->ct, scale));
  VB_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &p->opb, sizeof p->opb));
  VB_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn));
  // first operand: Bmem, stored (rows x cols, ld) before op; second: Amem K x M (ld K); C^T: N x M (ld N)
  VB_LT(cublasLtMatrixLayoutCreate(&p->lb, p->dt, p->opb == CUBLAS_OP_T ? K : N, p->opb == CUBLAS_OP_T ? N : K, p->ldb));
  VB_LT(cublasLtMatrixLayoutCreate(&p->la, p->dt, K, M, K));
  VB_LT(cublasLtMatrixLayoutCreate(&p->lc, p->dt, N, M, N));
  VB_LT(cublasLtMatmulPreferenceCreate(&pref));
  VB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  VB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align));
  VB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align));
  VB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align));
  VB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align));
  if (ctx->flags & VB_FLAG_STRICT_REDUCTION) {
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // partial sums kept in the compute type
    VB_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
  }
  {
    cublasLtMatmulHeuristicResult_t tmp[kMaxAlgos];
    memset(tmp, 0, sizeof tmp);
    // operand order as the swap needs: "A" = Bmem, "B" = Amem
    VB_LT(cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->desc, p->lb, p->la, p->lc, p->lc, pref, requested, tmp, &returned));
    for (int i = 0; i < returned && i < kMaxAlgos; ++i)
      if (tmp[i].state == CUBLAS_STATUS_SUCCESS && tmp[i].workspaceSize <= ws) p->results[p->n_algos++] = tmp[i];
  }
#undef VB_LT
  cublasLtMatmulPreferenceDestroy(pref);
  pref = nullptr;
  if (p->n_algos == 0) {
    st = VB_ERR_NO_ALGO;
    goto fail;
  }
  *out = p;
  return VB_OK;
fail:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  vb_plan_destroy(p);
  return st;
}

VB_API int vb_plan_count(const vb_plan* p) { return p ? p->n_algos : 0; }



VB_API int vb_plan_select(vb_plan* p, int index) {
  if (!p) return VB_ERR_ARG;
  if (index < 0 || index >= p->n_algos) return VB_ERR_INDEX;
  p->selected = index;
  return VB_OK;
}

// ---- calls ---------------------------------------------------------------------------------------
static inline int lt_matmul(vb_plan* p, int index, const void* A, const void* B, void* C, cudaStream_t stream) {
  if ((((uintptr_t)A) | ((uintptr_t)B) | ((uintptr_t)C)) & p->align_mask) return VB_ERR_MISALIGNED;
  vb_ctx* c = p->ctx;
  VB_CUBLAS(cublasLtMatmul(c->lt, p->desc, p->alpha, B, p->lb, A, p->la, p->beta, C, p->lc, C, p->lc,
                           &p->results[index].algo, c->workspace, c->workspace_bytes, stream));
  return VB_OK;
}

static inline int gemmex(vb_plan* p, const void* A, const void* B, void* C, cudaStream_t stream) {
  vb_ctx* c = p->ctx;
  std::lock_guard<std::mutex> lock(c->mu);
  if (!c->blas_stream_set || c->blas_stream != stream) {
    // cublasSetStream resets the handle's workspace to cuBLAS's default pool: set ours again.
    VB_CUBLAS(cublasSetStream(c->blas, stream));
    VB_CUBLAS(cublasSetWorkspace(c->blas, c->workspace, c->workspace_bytes));
    c->blas_stream = stream;
    c->blas_stream_set = true;
  }
  VB_CUBLAS(cublasGemmEx(c->blas, p->opb, CUBLAS_OP_N, p->m, p->n, p->k, p->alpha, B, p->dt, p->ldb, A, p->dt, p->k,
                         p->beta, C, p->dt, p->m, p->ct, CUBLAS_GEMM_DEFAULT));
  return VB_OK;
}

// The hot path: the plan's call (GemmEx, or the selected cuBLASLt algorithm) on `stream`.
VB_API int vb_run(vb_plan* p, const void* A, const void* B, void* C, cudaStream_t stream) {
  if (p->kind == VB_KIND_LT) return lt_matmul(p, p->selected, A, B, C, stream);
  return gemmex(p, A, B, C, stream);
}

// One cuBLASLt algorithm by index (autotuning).
VB_API int vb_run_index(vb_plan* p, int index, const void* A, const void* B, void* C, cudaStream_t stream) {
  if (!p) return VB_ERR_ARG;
  if (p->kind != VB_KIND_LT) return VB_ERR_KIND;
  if (index < 0 || index >= p->n_algos) return VB_ERR_INDEX;
  return lt_matmul(p, index, A, B, C, stream);
}

// ---- description ---------------------------------------------------------------------------------
static long long config_attr(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  size_t need = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS || need == 0 ||
      need > 8)
    return -1;
  unsigned char raw[8];
  memset(raw, 0, sizeof raw);
  size_t wrote = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, raw, need, &wrote) != CUBLAS_STATUS_SUCCESS) return -1;
  switch (need) {  // attributes are int32/uint32/uint16; read them with their own width and sign
    case 1: { uint8_t v; memcpy(&v, raw, 1); return v; }
    case 2: { uint16_t v; memcpy(&v, raw, 2); return v; }
    case 4: { int32_t v; memcpy(&v, raw, 4); return v; }
    default: { int64_t v; memcpy(&v, raw, 8); return (long long)v; }
  }
}

// "id=.. tile=.. stages=.. splitk=.. reduction=.. swizzle=.. custom=.. inner=.. cluster=.. ws=.. waves=.."
// (numeric enum values; the Python side names tiles, stages and clusters from cublasLt.h).
VB_API int vb_describe(const vb_plan* p, int index, char* buf, int len) {
  if (!p || !buf || len < 1) return VB_ERR_ARG;
  if (p->kind != VB_KIND_LT) {
    snprintf(buf, (size_t)len, "cublasGemmEx CUBLAS_GEMM_DEFAULT");
    return VB_OK;
  }
  if (index < 0 || index >= p->n_algos) return VB_ERR_INDEX;
  const cublasLtMatmulHeuristicResult_t& r = p->results[index];
  const cublasLtMatmulAlgo_t* a = &r.algo;
  snprintf(buf, (size_t)len,
           "id=%lld tile=%lld stages=%lld splitk=%lld reduction=%lld swizzle=%lld custom=%lld inner=%lld cluster=%lld "
           "ws=%zu waves=%.3f",
           config_attr(a, CUBLASLT_ALGO_CONFIG_ID), config_attr(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
           config_attr(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), config_attr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
           config_attr(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), config_attr(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
           config_attr(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), config_attr(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
           config_attr(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), r.workspaceSize, (double)r.wavesCount);
  return VB_OK;
}

// ---- configurations outside the heuristic's list ---------------------------------------------------
// The heuristic returns a short, ranked list; cuBLASLt runs more configurations of the same kernels than it lists
// (another split-K factor, a rebuilt algorithm another M's list does not offer). vb_lt_plan_add_config builds one
// from its attributes, asks cuBLASLt whether it runs this problem (cublasLtMatmulAlgoCheck: the operands' layouts,
// the workspace it needs) and appends it to the plan's results, so vb_run_index / vb_plan_select serve it like a
// heuristic result. Only for plans made for 256-byte-aligned operands: the check assumes the widest alignment,
// and a call less aligned than its plan goes elsewhere before it gets here (the caller's align_mask).
// attrs: id, tile, stages, splitk, reduction, swizzle, custom, inner, cluster (vb_describe's order); < 0 keeps
// what cublasLtMatmulAlgoInit set. A split-K factor > 1 always reduces in the compute type (fp32 partial sums).
static int set_config_attr(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, long long v) {
  if (v < 0) return VB_OK;
  size_t need = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, nullptr, 0, &need) != CUBLAS_STATUS_SUCCESS || need == 0 ||
      need > 8)
    return VB_ERR_ARG;
  unsigned char raw[8];
  memset(raw, 0, sizeof raw);
  switch (need) {
    case 1: { uint8_t x = (uint8_t)v; memcpy(raw, &x, 1); break; }
    case 2: { uint16_t x = (uint16_t)v; memcpy(raw, &x, 2); break; }
    case 4: { int32_t x = (int32_t)v; memcpy(raw, &x, 4); break; }
    default: { int64_t x = (int64_t)v; memcpy(raw, &x, 8); break; }
  }
  VB_CUBLAS(cublasLtMatmulAlgoConfigSetAttribute(algo, attr, raw, need));
  return VB_OK;
}

static const cublasLtMatmulAlgoConfigAttributes_t kConfigAttrs[9] = {
    CUBLASLT_ALGO_CONFIG_ID,           CUBLASLT_ALGO_CONFIG_TILE_ID,        CUBLASLT_ALGO_CONFIG_STAGES_ID,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM,   CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
    CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};

static bool same_config(const cublasLtMatmulAlgo_t* a, const cublasLtMatmulAlgo_t* b) {
  for (int i = 0; i < 9; ++i)
    if (config_attr(a, kConfigAttrs[i]) != config_attr(b, kConfigAttrs[i])) return false;
  return true;
}

VB_API int vb_lt_plan_add_config(vb_plan* p, const long long* attrs, int* index_out) {
  if (!p || !attrs || !index_out) return VB_ERR_ARG;
  *index_out = -1;
  if (p->kind != VB_KIND_LT) return VB_ERR_KIND;
  if (p->align_mask != 255 || attrs[0] < 0) return VB_ERR_ARG;
  long long want[9];
  memcpy(want, attrs, sizeof want);
  if (want[3] > 1) want[4] = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // fp32 partial sums, never the output type
  if (want[3] == 1) want[4] = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (want[3] == 0 || want[3] > 1024) return VB_ERR_ARG;
  cublasLtMatmulAlgo_t algo;
  memset(&algo, 0, sizeof algo);
  const cudaDataType_t scale = p->ct == CUBLAS_COMPUTE_32F ? CUDA_R_32F : CUDA_R_16F;
  VB_CUBLAS(cublasLtMatmulAlgoInit(p->ctx->lt, p->ct, scale, p->dt, p->dt, p->dt, p->dt, (int)want[0], &algo));
  for (int i = 1; i < 9; ++i) {
    int st = set_config_attr(&algo, kConfigAttrs[i], want[i]);
    if (st != VB_OK) return st;
  }
  for (int i = 0; i < p->n_algos; ++i)
    if (same_config(&p->results[i].algo, &algo)) {
      *index_out = i;
      return VB_OK;
    }
  if (p->n_algos >= kMaxAlgos) return VB_ERR_INDEX;
  cublasLtMatmulHeuristicResult_t r;
  memset(&r, 0, sizeof r);
  VB_CUBLAS(cublasLtMatmulAlgoCheck(p->ctx->lt, p->desc, p->lb, p->la, p->lc, p->lc, &algo, &r));
  if (r.state != CUBLAS_STATUS_SUCCESS) return VB_CUBLAS_BASE + (int)r.state;
  if (r.workspaceSize > p->ctx->workspace_bytes) return VB_ERR_NO_ALGO;
  r.algo = algo;
  p->results[p->n_algos] = r;
  *index_out = p->n_algos++;
  return VB_OK;
}

// Whether result `index` can take another split-K factor (its algorithm's capabilities) and the most K-splits
// it takes; 0 where it cannot be split.
VB_API int vb_lt_splitk_support(const vb_plan* p, int index, int* supported) {
  if (!p || !supported) return VB_ERR_ARG;
  *supported = 0;
  if (p->kind != VB_KIND_LT) return VB_ERR_KIND;
  if (index < 0 || index >= p->n_algos) return VB_ERR_INDEX;
  int32_t v = 0;
  size_t wrote = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&p->results[index].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &v, sizeof v,
                                        &wrote) == CUBLAS_STATUS_SUCCESS)
    *supported = v ? 1 : 0;
  return VB_OK;
}
