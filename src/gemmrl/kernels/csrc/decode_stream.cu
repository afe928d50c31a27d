// Decode GEMM that streams the weight at the HBM roofline (sm_90a): C[M,N] = A[M,K] @ W[N,K]^T for M <= 64,
// fp16 (or bf16 with -DGEMMRL_BF16=1) in and out, fp32 accumulation. Layout tn: A row-major [M,K] (lda), W = B^T
// row-major [N,K] (ldb: the nn.Linear weight as stored), C row-major [M,N] (ldc).
//
// Why: at M <= 64 the weight is the whole cost (2NK bytes against 2MNK flops), so the time is how fast N x K halves
// cross from HBM. The kernel is built around that stream:
// - swap AB on mma.sync m16n8k16: the weight is the 16-row "A" operand, the tokens the 8-column "B" operand (M = 1
//   wastes 7/8 of an n8 tile instead of 15/16 of an m16 one; M = 8 wastes nothing);
// - K permuted inside each 32-column chunk so that every lane's fragment of both operands is one 16-byte vector:
//   lane (g, t) holds columns 8t..8t+7 of weight rows g and g+8 and of token g, and logical k (2t+e) of the two
//   mma of a chunk is physical column 8t + 4h + e (k 2t+8+e: 8t + 4h + 2 + e), the same map for both operands;
// - the loads are per-lane cp.async of 16 bytes into a warp-private ring in shared memory (ST deep): a lane reads
//   back only what it wrote, so the main loop has no barrier at all, only cp.async.wait_group; a warp keeps ST-1
//   steps in flight, a step being U adjacent chunks (R x U KB of weight), so that a row's U x 64 bytes are asked for
//   back to back (whole 128-byte lines and longer runs for the DRAM);
// - a CTA is WR x WK warps: WR warps own R m16 row tiles each (RB = 16 R WR rows), WK warps interleave the CTA's K
//   chunks. Warps with one WK index read the same activation chunk at about the same time (cp.async.ca: L1 serves the
//   repeats), so activations cross L2 once per RB rows, not once per 16;
// - split S along K (grid.y) only where N / RB gives too few CTAs: each CTA parks its fp32 tile partial in a
//   workspace, the last CTA of a tile (a counter per tile, atomicAdd after __threadfence) sums the S partials in
//   split order (deterministic) and writes C, then puts the counter back to 0. One launch, no memset; workspace and
//   counters are allocated (counters zeroed) once, when a shape's plan is made.
// Tails: N and K free (rows past N and columns past K are zero-filled by cp.async's src-size 0; rows past N are not
// stored), M <= 8 MT (tokens past M are zero in registers and never stored). Needs K % 8 == 0, lda and ldb % 8 == 0
// and 16-byte aligned A and W (cp.async of 16 bytes); the run entries return cudaErrorInvalidValue otherwise.
//
// Entry points (extern "C"): gemmrl_decode_gemm (explicit config, one call), gemmrl_decode_plan / _plan_run /
// _plan_free (a shape's prepared launch: what a hot path calls), gemmrl_decode_smem_bytes and
// gemmrl_decode_ctas_per_sm (the validity predicate's device facts), gemmrl_gemm (the gemmrl ABI with the .cu's own
// pick of config, split 1, so that it needs no workspace).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef GEMMRL_BF16
#define GEMMRL_BF16 0
#endif
#if GEMMRL_BF16
#define AB_PTX "bf16"
typedef __nv_bfloat16 elem_t;
__device__ __forceinline__ elem_t pack1(float a) { return __float2bfloat16_rn(a); }
#else
#define AB_PTX "f16"
typedef __half elem_t;
__device__ __forceinline__ elem_t pack1(float a) { return __float2half_rn(a); }
#endif

namespace {

constexpr int CHUNK = 32;            // K columns of one warp step (4 lanes x 8 elements)
constexpr int SMEM_LIMIT = 232448;   // opt-in shared memory per block on H100/H200

__device__ __forceinline__ void cp16_cg(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp16_ca(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint4 lds128(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB_PTX "." AB_PTX ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int R, int WR, int WK, int U, int MT, int ST>
struct Cfg {
  static constexpr int WARPS = WR * WK, THREADS = 32 * WARPS, RB = 16 * R * WR;
  static constexpr int Q = 2 * R + MT;                  // 16-byte vectors per lane per stage
  static constexpr int RING = WARPS * ST * U * Q * 512;  // bytes
  static constexpr int RED = WARPS * R * MT * 512;      // the partial tiles of every warp, for the epilogue
  static constexpr int SMEM = RING > RED ? RING : RED;
};

template <int R, int WR, int WK, int U, int MT, int ST>
__device__ __forceinline__ void decode_body(const elem_t* __restrict__ A, const elem_t* __restrict__ W,
                                            elem_t* __restrict__ C, int M, int N, int K, int lda, int ldw, int ldc,
                                            int cps, float* __restrict__ ws, unsigned* __restrict__ counters) {
  using CF = Cfg<R, WR, WK, U, MT, ST>;
  constexpr int STEP = U * CHUNK;  // K columns of one warp step: U adjacent chunks (a row's U x 64 bytes back to back)
  constexpr int Q = CF::Q, RB = CF::RB, THREADS = CF::THREADS;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int is_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wr = warp % WR, wk = warp / WR;
  const int g = lane >> 2, t = lane & 3;
  const int nb = blockIdx.x * RB, n0 = nb + wr * 16 * R;
  const int s = blockIdx.y, S = gridDim.y;
  const int nchunks = (K + STEP - 1) / STEP;  // steps
  const int c_begin = s * cps + wk, c_end = min(nchunks, s * cps + cps);
  const int my_n = c_end > c_begin ? (c_end - c_begin + WK - 1) / WK : 0;

  const elem_t* wsrc[R][2];
  bool wlive[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = n0 + r * 16 + g + 8 * h;
      wlive[r][h] = row < N;
      wsrc[r][h] = W + size_t(wlive[r][h] ? row : 0) * ldw + 8 * t;
    }
  const elem_t* asrc[MT];
  bool alive[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    alive[j] = g + 8 * j < M;
    asrc[j] = A + size_t(alive[j] ? g + 8 * j : 0) * lda + 8 * t;
  }
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem)) + warp * ST * U * Q * 512 + lane * 16;

  // step i of this warp (K columns (c_begin + WK i) * STEP ..) into ring slot ``slot``; always one commit group
  auto issue = [&](int i, int slot) {
    if (i < my_n) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int col = (c_begin + WK * i) * STEP + u * CHUNK;
        const bool kin = col + 8 * t < K;
        const unsigned dst = base + (slot * U + u) * Q * 512;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const bool live = kin && wlive[r][h];
            cp16_cg(dst + (2 * r + h) * 512, live ? wsrc[r][h] + col : W, live ? 16 : 0);
          }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int col = (c_begin + WK * i) * STEP + u * CHUNK;
        const bool kin = col + 8 * t < K;
        const unsigned dst = base + (slot * U + u) * Q * 512;
#pragma unroll
        for (int j = 0; j < MT; ++j)
          if (alive[j]) cp16_ca(dst + (2 * R + j) * 512, kin ? asrc[j] + col : A, kin ? 16 : 0);
      }
    }
    cp_commit();
  };

  float acc[R][MT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;

#pragma unroll
  for (int i = 0; i < ST - 1; ++i) issue(i, i);
  int slot = 0, next = ST - 1;
  for (int i = 0; i < my_n; ++i) {
    cp_wait<ST - 2>();  // (ST - 1 + i) groups committed, step i's is done
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const unsigned src = base + (slot * U + u) * Q * 512;
      uint4 w[R][2], x[MT];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        w[r][0] = lds128(src + (2 * r) * 512);
        w[r][1] = lds128(src + (2 * r + 1) * 512);
      }
#pragma unroll
      for (int j = 0; j < MT; ++j) x[j] = alive[j] ? lds128(src + (2 * R + j) * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          mma16816(acc[r][j], w[r][0].x, w[r][1].x, w[r][0].y, w[r][1].y, x[j].x, x[j].y);
          mma16816(acc[r][j], w[r][0].z, w[r][1].z, w[r][0].w, w[r][1].w, x[j].z, x[j].w);
        }
    }
    // into the slot consumed one step ago: its shared-memory reads fed the mma above, so they are done
    issue(i + ST - 1, next);
    slot = slot + 1 == ST ? 0 : slot + 1;
    next = next + 1 == ST ? 0 : next + 1;
  }
  cp_wait<0>();
  __syncthreads();

  // epilogue: every warp's fragments into shared memory ([warp][r][j][lane] float4), summed over the WK warps of a
  // row tile in a fixed order, written n-contiguous (coalesced)
  float4* red = reinterpret_cast<float4*>(smem);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < MT; ++j)
      red[((warp * R + r) * MT + j) * 32 + lane] = make_float4(acc[r][j][0], acc[r][j][1], acc[r][j][2], acc[r][j][3]);
  __syncthreads();
  const float* redf = reinterpret_cast<const float*>(smem);
  const int total = M * RB;
  auto tile_sum = [&](int tok, int nl) {
    const int wr_ = nl / (16 * R), r = (nl / 16) % R, rr = nl % 16;
    const int ln = (rr & 7) * 4 + ((tok & 7) >> 1), comp = (rr >> 3) * 2 + (tok & 1), j = tok >> 3;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < WK; ++k) v += redf[((((k * WR + wr_) * R + r) * MT + j) * 32 + ln) * 4 + comp];
    return v;
  };
  if (S == 1) {
    for (int idx = threadIdx.x; idx < total; idx += THREADS) {
      const int tok = idx / RB, nl = idx % RB, n = nb + nl;
      if (n < N) C[size_t(tok) * ldc + n] = pack1(tile_sum(tok, nl));
    }
    return;
  }
  float* part = ws + size_t(s) * M * N;
  for (int idx = threadIdx.x; idx < total; idx += THREADS) {
    const int tok = idx / RB, nl = idx % RB, n = nb + nl;
    if (n < N) part[size_t(tok) * N + n] = tile_sum(tok, nl);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&counters[blockIdx.x], 1u) == unsigned(S - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < total; idx += THREADS) {
    const int tok = idx / RB, nl = idx % RB, n = nb + nl;
    if (n >= N) continue;
    float v = 0.f;
    for (int k = 0; k < S; ++k) v += __ldcg(ws + (size_t(k) * M + tok) * N + n);
    C[size_t(tok) * ldc + n] = pack1(v);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // every CTA of the tile has counted: clean for the next call
}

// a config whose ring or epilogue is past the opt-in shared memory compiles to an empty kernel (make_plan refuses it
// before any launch): about half of the instantiations, and half of the build's time
template <int R, int WR, int WK, int U, int MT, int ST>
__global__ void __launch_bounds__(32 * WR * WK)
    decode_kernel(const elem_t* __restrict__ A, const elem_t* __restrict__ W, elem_t* __restrict__ C, int M, int N,
                  int K, int lda, int ldw, int ldc, int cps, float* __restrict__ ws, unsigned* __restrict__ counters) {
  if constexpr (Cfg<R, WR, WK, U, MT, ST>::SMEM <= SMEM_LIMIT)
    decode_body<R, WR, WK, U, MT, ST>(A, W, C, M, N, K, lda, ldw, ldc, cps, ws, counters);
}

// ---------------------------------------------------------------------------------------------------------------
// the instantiations: (R, WR, WK) x (U, ST) x MT. Keep in step with kernels/decode_gemm.py (SHAPES, DEPTHS, MTS).
typedef void (*kernel_t)(const elem_t*, const elem_t*, elem_t*, int, int, int, int, int, int, int, float*, unsigned*);
struct Inst {
  int r, wr, wk, u, mt, st, smem, threads;
  kernel_t fn;
  bool attr;
};

#define GEMMRL_DEC1(R_, WR_, WK_, U_, MT_, ST_)                                                    \
  {R_, WR_, WK_, U_, MT_, ST_, Cfg<R_, WR_, WK_, U_, MT_, ST_>::SMEM, 32 * WR_ * WK_,             \
   decode_kernel<R_, WR_, WK_, U_, MT_, ST_>, false},
// the deep rings (U = 1: 12, 16; U = 2: 6, 8; U = 4: 4) keep 100-135 KB of weight in flight an SM at M <= 8, the
// vendor's 64x8 tile with 16 stages of 64 K columns 128 KB; the shallow ones keep 32-64 KB
#define GEMMRL_DEC_ST(R_, WR_, WK_, MT_) GEMMRL_DEC1(R_, WR_, WK_, 1, MT_, 4) GEMMRL_DEC1(R_, WR_, WK_, 1, MT_, 6) \
  GEMMRL_DEC1(R_, WR_, WK_, 1, MT_, 8) GEMMRL_DEC1(R_, WR_, WK_, 1, MT_, 12) GEMMRL_DEC1(R_, WR_, WK_, 1, MT_, 16) \
  GEMMRL_DEC1(R_, WR_, WK_, 2, MT_, 3) GEMMRL_DEC1(R_, WR_, WK_, 2, MT_, 4) GEMMRL_DEC1(R_, WR_, WK_, 2, MT_, 6) \
  GEMMRL_DEC1(R_, WR_, WK_, 2, MT_, 8) GEMMRL_DEC1(R_, WR_, WK_, 4, MT_, 2) GEMMRL_DEC1(R_, WR_, WK_, 4, MT_, 3) \
  GEMMRL_DEC1(R_, WR_, WK_, 4, MT_, 4)
#define GEMMRL_DEC(R_, WR_, WK_) GEMMRL_DEC_ST(R_, WR_, WK_, 1) GEMMRL_DEC_ST(R_, WR_, WK_, 2) \
  GEMMRL_DEC_ST(R_, WR_, WK_, 4) GEMMRL_DEC_ST(R_, WR_, WK_, 8)

Inst g_insts[] = {
    GEMMRL_DEC(1, 1, 8) GEMMRL_DEC(2, 1, 8) GEMMRL_DEC(2, 2, 4) GEMMRL_DEC(2, 4, 2) GEMMRL_DEC(2, 4, 1)
    GEMMRL_DEC(4, 2, 2)
};
#undef GEMMRL_DEC
#undef GEMMRL_DEC_ST
#undef GEMMRL_DEC1
constexpr int NINST = sizeof(g_insts) / sizeof(g_insts[0]);

int mt_for(int M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : M <= 64 ? 8 : 0; }

Inst* find(int r, int wr, int wk, int u, int st, int M) {
  const int mt = mt_for(M);
  for (int i = 0; i < NINST; ++i) {
    Inst& x = g_insts[i];
    if (x.r == r && x.wr == wr && x.wk == wk && x.u == u && x.st == st && x.mt == mt) return &x;
  }
  return nullptr;
}

int prepare_inst(Inst* x) {  // the opt-in shared memory, once per instantiation (outside any call's hot path)
  if (!x->attr) {
    if (x->smem > SMEM_LIMIT) return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(x->fn),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, x->smem);
    if (e != cudaSuccess) return e;
    x->attr = true;
  }
  return 0;
}

struct Plan {
  Inst* inst;
  int M, N, K, lda, ldb, ldc, split, cps;
  dim3 grid;
  float* ws;
  unsigned* counters;
};

int launch(const Plan& p, const void* A, const void* B, void* C, cudaStream_t stream) {
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) & 15) return cudaErrorInvalidValue;
  p.inst->fn<<<p.grid, p.inst->threads, p.inst->smem, stream>>>(
      static_cast<const elem_t*>(A), static_cast<const elem_t*>(B), static_cast<elem_t*>(C), p.M, p.N, p.K, p.lda,
      p.ldb, p.ldc, p.cps, p.ws, p.counters);
  return static_cast<int>(cudaGetLastError());
}

// split S: the steps (U chunks) per split and whether every split has at least one
bool make_plan(Plan& p, int M, int N, int K, int lda, int ldb, int ldc, int r, int wr, int wk, int u, int st,
               int split, void* ws, void* counters) {
  if (M < 1 || M > 64 || N < 1 || K < 8 || K % 8 || lda % 8 || ldb % 8 || split < 1) return false;
  Inst* x = find(r, wr, wk, u, st, M);
  if (!x || prepare_inst(x) != 0) return false;
  const int nchunks = (K + u * CHUNK - 1) / (u * CHUNK), cps = (nchunks + split - 1) / split;
  if ((split - 1) * cps >= nchunks) return false;
  if (split > 1 && (!ws || !counters)) return false;
  const int rb = 16 * r * wr;
  p = Plan{x, M, N, K, lda, ldb, ldc, split, cps, dim3((N + rb - 1) / rb, split), static_cast<float*>(ws),
           static_cast<unsigned*>(counters)};
  return true;
}

}  // namespace

extern "C" {

// shared memory bytes of a config at M (0: not instantiated)
int gemmrl_decode_smem_bytes(int r, int wr, int wk, int u, int st, int M) {
  Inst* x = find(r, wr, wk, u, st, M);
  return x ? x->smem : 0;
}

// CTAs of a config one SM holds at once (0: none fits; < 0: a CUDA error)
int gemmrl_decode_ctas_per_sm(int r, int wr, int wk, int u, int st, int M) {
  Inst* x = find(r, wr, wk, u, st, M);
  if (!x) return 0;
  int e = prepare_inst(x);
  if (e) return -e;
  int n = 0;
  cudaError_t ce = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, x->fn, x->threads, x->smem);
  return ce == cudaSuccess ? n : -static_cast<int>(ce);
}

// bytes of fp32 workspace and of counters a split needs (the counters must be zero before the first call; the
// kernel leaves them zero)
size_t gemmrl_decode_workspace_bytes(int M, int N, int r, int wr, int split) {
  return split > 1 ? size_t(split) * M * N * 4 : 0;
}
size_t gemmrl_decode_counter_bytes(int N, int r, int wr, int split) {
  const int rb = 16 * r * wr;
  return split > 1 ? size_t((N + rb - 1) / rb) * 4 : 0;
}

void* gemmrl_decode_plan(int M, int N, int K, int lda, int ldb, int ldc, int r, int wr, int wk, int u, int st,
                         int split, void* ws, void* counters) {
  Plan p;
  if (!make_plan(p, M, N, K, lda, ldb, ldc, r, wr, wk, u, st, split, ws, counters)) return nullptr;
  Plan* out = static_cast<Plan*>(malloc(sizeof(Plan)));
  if (out) *out = p;
  return out;
}

int gemmrl_decode_plan_run(void* plan, const void* A, const void* B, void* C, cudaStream_t stream) {
  return launch(*static_cast<Plan*>(plan), A, B, C, stream);
}

void gemmrl_decode_plan_free(void* plan) { free(plan); }

int gemmrl_decode_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                       void* ws, void* counters, int r, int wr, int wk, int u, int st, int split, cudaStream_t stream) {
  Plan p;
  if (!make_plan(p, M, N, K, lda, ldb, ldc, r, wr, wk, u, st, split, ws, counters)) return cudaErrorInvalidValue;
  return launch(p, A, B, C, stream);
}

// the gemmrl ABI: the .cu's own pick (split 1: no workspace, no counters)
int gemmrl_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc, void* workspace,
                size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;
  return gemmrl_decode_gemm(A, B, C, M, N, K, lda, ldb, ldc, nullptr, nullptr, 1, 1, 8, 4, M <= 32 ? 3 : 2, 1, stream);
}

}  // extern "C"
