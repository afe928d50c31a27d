// Cluster split-K HGEMM for Hopper (sm_90): C[M,N] = A[M,K] @ B^T[N,K]^T, fp16 in, fp32 accumulation, fp16 out.
//
// Why: on shapes with few output tiles and long K (512_256_2048, 256_256_8192, 1024_256_4096...) a GEMM needs
// split-K to use the SMs, and the usual reductions cost what the split saves: a second kernel (a launch, and the
// fp32 partials through L2 and back), or the last CTA of a tile summing every partial alone. Here the CTAs that
// split one tile's K form a thread-block cluster (up to 16 on H100, non-portable); each keeps its fp32 partial in
// its own shared memory, and after a cluster barrier CTA r sums rows [r*BM/S, (r+1)*BM/S) of all S partials
// through distributed shared memory (in rank order: deterministic) and writes them. No workspace, one launch, no
// atomics. Tiles are 128x128 (the L2->SM traffic of a split-K GEMM is 2*K*M*N*(1/BM + 1/BN) bytes whatever the
// split), 8 warps of 64x32 with mma.sync m16n8k16, ldmatrix from padded shared rows, a 4-stage cp.async pipeline.
//
// ABI gemmrl (kernels/cuda_source.py), layout tn: A row-major [M,K] (lda), B as B^T row-major [N,K] (ldb),
// C row-major [M,N] (ldc). Needs K, lda, ldb multiples of 8 and 16-byte aligned A and B (cp.async of 16 bytes);
// returns cudaErrorInvalidValue otherwise. The split S is chosen per shape: the largest of 1, 2, 4, 8, 16 with
// tiles * S <= 128 CTAs and at least 2 BK steps per CTA (16 only for at most 7 tiles).
//
// Measured (H100, docs/measurements.md the headroom run): correct on every shape tried, but 0.36x of vendor_best in graph
// on 16 few-tile long-K shapes. The cluster reduction scales (512_256_2048: 38.7 us at S=1, 9.0 us at S=8), the
// mma.sync main loop does not keep up: ~1000 flop/clk/SM with no split, a quarter of what wgmma reaches. The
// reduction is the part worth keeping; the main loop should be TMA + wgmma (the CUTLASS family's).
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace cg = cooperative_groups;

namespace {

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 4, THREADS = 256;
constexpr int LDS = BK + 8;          // halves per shared row: 144 bytes, so ldmatrix's 8 rows hit 8 distinct banks
constexpr int LDP = BN + 4;          // floats per row of the fp32 partial
constexpr int STAGE_HALVES = (BM + BN) * LDS;
constexpr size_t SMEM_PIPE = size_t(STAGES) * STAGE_HALVES * sizeof(__half);
constexpr size_t SMEM_PART = size_t(BM) * LDP * sizeof(float);
constexpr size_t SMEM_BYTES = SMEM_PIPE > SMEM_PART ? SMEM_PIPE : SMEM_PART;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int n = pred ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// one stage: A rows [m0, m0+BM) and B^T rows [n0, n0+BN), K columns [k, k+BK), zero past M, N and k_end
__device__ __forceinline__ void load_stage(__half* st, const __half* A, const __half* Bt, int M, int N, int lda,
                                           int ldb, int m0, int n0, int k, int k_end) {
  __half* sa = st;
  __half* sb = st + BM * LDS;
  constexpr int CHUNKS = BM * BK / 8;  // 16-byte chunks per operand tile (512)
#pragma unroll
  for (int i = threadIdx.x; i < CHUNKS; i += THREADS) {
    int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
    bool kin = k + c < k_end;
    int gm = m0 + r, gn = n0 + r;
    bool pa = kin && gm < M, pb = kin && gn < N;
    cp_async16(sa + r * LDS + c, pa ? A + size_t(gm) * lda + k + c : A, pa);
    cp_async16(sb + r * LDS + c, pb ? Bt + size_t(gn) * ldb + k + c : Bt, pb);
  }
}

template <int S>
__global__ void __launch_bounds__(THREADS, 1)
    cluster_splitk_kernel(const __half* __restrict__ A, const __half* __restrict__ Bt, __half* __restrict__ C, int M,
                          int N, int K, int lda, int ldb, int ldc, int k_per) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* smem = reinterpret_cast<__half*>(smem_raw);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * k_per;
  const int k_end = min(K, k_begin + k_per);
  const int nk = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // this warp's 64x32 sub-tile
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_stage(smem + s * STAGE_HALVES, A, Bt, M, N, lda, ldb, m0, n0, k_begin + s * BK, k_end);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    int nxt = kt + STAGES - 1;  // refill the slot consumed in the previous iteration (free after the barrier)
    if (nxt < nk)
      load_stage(smem + (nxt % STAGES) * STAGE_HALVES, A, Bt, M, N, lda, ldb, m0, n0, k_begin + nxt * BK, k_end);
    cp_async_commit();
    const __half* sa = smem + (kt % STAGES) * STAGE_HALVES;
    const __half* sb = sa + BM * LDS;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[4][4], bf[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ldmatrix_x4(af[i], sa + (wm + i * 16 + (lane % 16)) * LDS + kk + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        ldmatrix_x4(bf[j], sb + (wn + j * 16 + (lane % 8) + (lane / 16) * 8) * LDS + kk + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma16816(acc[i][j], af[i], bf[j / 2][(j % 2) * 2], bf[j / 2][(j % 2) * 2 + 1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline's buffers: they hold the partial now

  float* part = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int r = wm + i * 16 + lane / 4, c = wn + j * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(part + r * LDP + c) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(part + (r + 8) * LDP + c) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
  cluster.sync();  // every partial of the tile is written (and visible across the cluster)

  const int rows = BM / S;
  const int r0 = rank * rows;
  for (int idx = threadIdx.x; idx < rows * (BN / 4); idx += THREADS) {
    int r = r0 + idx / (BN / 4), c = (idx % (BN / 4)) * 4;
    float4 v[S];
#pragma unroll
    for (int q = 0; q < S; ++q)  // every remote load in flight before the first add
      v[q] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(part, q) + r * LDP + c);
    float4 s = v[0];
#pragma unroll
    for (int q = 1; q < S; ++q) {  // rank order: the same sum whoever finishes first
      s.x += v[q].x;
      s.y += v[q].y;
      s.z += v[q].z;
      s.w += v[q].w;
    }
    int gm = m0 + r, gn = n0 + c;
    if (gm < M) {
      __half* out = C + size_t(gm) * ldc + gn;
      float vals[4] = {s.x, s.y, s.z, s.w};
      if (gn + 3 < N && (reinterpret_cast<uintptr_t>(out) & 7) == 0) {
        __half2 lo = __floats2half2_rn(vals[0], vals[1]), hi = __floats2half2_rn(vals[2], vals[3]);
        uint2 packed = make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
        *reinterpret_cast<uint2*>(out) = packed;
      } else {
        for (int e = 0; e < 4; ++e)
          if (gn + e < N) out[e] = __float2half_rn(vals[e]);
      }
    }
  }
  cluster.sync();  // no CTA leaves while a peer may still read its shared memory
}

int g_force_split = 0;  // > 0: use this split (benchmarks/acceptance/cluster_splitk_probe.py)

int pick_split(int M, int N, int K) {
  if (g_force_split > 0) return g_force_split;
  int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
  int best = 1;
  for (int s = 2; s <= 16; s *= 2)  // 16-CTA clusters: 7 fit at once on an H100 (probe): more tiles take 2 waves
    if (tiles * s <= 128 && K / s >= 2 * BK && (s < 16 || tiles <= 7)) best = s;
  return best;
}

// the kernel's attributes, set once per split: its shared memory, and clusters of 16 (non-portable) where S is 16
template <int S>
cudaError_t configure() {
  static const cudaError_t status = [] {
    cudaError_t e = cudaFuncSetAttribute(cluster_splitk_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(SMEM_BYTES));
    if (e == cudaSuccess && S > 8)
      e = cudaFuncSetAttribute(cluster_splitk_kernel<S>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
  }();
  return status;
}

// a launch of ``grid`` whose clusters are the S CTAs along z (``attr`` must outlive ``cfg``'s use)
template <int S>
cudaLaunchConfig_t cluster_config(dim3 grid, cudaStream_t stream, cudaLaunchAttribute (&attr)[1]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(THREADS, 1, 1);
  cfg.dynamicSmemBytes = SMEM_BYTES;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = S;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <int S>
cudaError_t launch(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                   cudaStream_t stream) {
  cudaError_t e = configure<S>();
  if (e != cudaSuccess) return e;
  int k_per = ((K + S * BK - 1) / (S * BK)) * BK;  // whole BK steps per CTA; the last slice may be shorter or empty
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = cluster_config<S>(dim3((N + BN - 1) / BN, (M + BM - 1) / BM, S), stream, attr);
  return cudaLaunchKernelEx(&cfg, cluster_splitk_kernel<S>, static_cast<const __half*>(A),
                            static_cast<const __half*>(B), static_cast<__half*>(C), M, N, K, lda, ldb, ldc, k_per);
}

template <int S>
int max_active_clusters() {
  cudaError_t e = configure<S>();
  int n = -1;
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = cluster_config<S>(dim3(1, 1, S), nullptr, attr);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&n, cluster_splitk_kernel<S>, &cfg);
  return e == cudaSuccess ? n : -static_cast<int>(e);
}

}  // namespace

// probes (benchmarks/acceptance/cluster_splitk_probe.py): force the split; how many clusters of S CTAs fit on the device at once
extern "C" void cluster_splitk_force_split(int s) { g_force_split = s; }

extern "C" int cluster_splitk_max_active_clusters(int S) {
  switch (S) {
    case 1: return max_active_clusters<1>();
    case 2: return max_active_clusters<2>();
    case 4: return max_active_clusters<4>();
    case 8: return max_active_clusters<8>();
    case 16: return max_active_clusters<16>();
    default: return -1;
  }
}

extern "C" int gemmrl_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;
  if (M <= 0 || N <= 0 || K <= 0 || K % 8 || lda % 8 || ldb % 8 ||
      ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) & 15))
    return static_cast<int>(cudaErrorInvalidValue);
  switch (pick_split(M, N, K)) {
    case 1: return static_cast<int>(launch<1>(A, B, C, M, N, K, lda, ldb, ldc, stream));
    case 2: return static_cast<int>(launch<2>(A, B, C, M, N, K, lda, ldb, ldc, stream));
    case 4: return static_cast<int>(launch<4>(A, B, C, M, N, K, lda, ldb, ldc, stream));
    case 8: return static_cast<int>(launch<8>(A, B, C, M, N, K, lda, ldb, ldc, stream));
    default: return static_cast<int>(launch<16>(A, B, C, M, N, K, lda, ldb, ldc, stream));
  }
}
