// Small-tile HGEMM with a one-launch cluster/DSMEM split-K (sm_90): C[M,N] = A[M,K] @ B^T[N,K]^T, fp16 (or bf16
// with -DGEMMRL_BF16=1) in and out, fp32 accumulation.
//
// Why: where M x N is small (min(M,N) <= 256, a few dozen 64x64 tiles or fewer) and K is 256..16384, a GEMM is a
// latency problem. One CTA streams its K slice from L2 at ~32 bytes/clock (the wgmma-family run's pace probe), so a tile that
// walks all of K alone takes K/64 x ~0.15-0.3 us; the vendor runs 64_64_1024 at 3.4 us in the graph protocol against
// 0.96 us for an empty kernel. Splitting K fixes the pace, and the reductions the other families have cost a second
// launch (Triton's two-pass split), a global workspace fix-up (CUTLASS stream-K) or a TMA/mbarrier set-up that is
// itself ~0.6 us on a one-CTA problem (the wgmma family: 64_64_256 3.06 us against the vendor's 2.46). This kernel is
// the plainest thing that splits: cp.async 16-byte loads of the whole slice issued up front (STAGES-deep ring of
// 64-deep K steps), ldmatrix + mma.sync m16n8k16 from padded rows, and for S > 1 the S CTAs of one tile form a
// thread-block cluster along z: each parks its fp32 partial in its own shared memory, and after a cluster barrier
// CTA r sums its share of the tile's float4 chunks over all S partials through distributed shared memory, in rank
// order (deterministic), and writes them. No workspace, no atomics, one launch. S = 1 stores from registers, or
// (STAGED, instantiations of their own, so the register-store kernels stay as they were) through shared memory in
// whole 16-byte chunks: the register stores write each 32-byte sector of C in two 16-byte halves (ncu at
// 2048_2048_64: 2x the sectors at L1, ~3x at L2, docs/measurements.md, the pace-probe run), nothing on a few tiles and most of the time where
// C is megabytes.
// (Since the tiny-family run the partials are pushed: each CTA stores the rows CTA r owns into r's shared memory and r sums
// its own shared memory; since the tiny K-step run by st.async, completing on r's mbarrier, with no cluster barrier after the
// start; see the S > 1 epilogue.)
// cluster_splitk.cu (the headroom run) is the same reduction on one 128x128 tile; its lesson was that mma.sync cannot keep
// up on big tiles, so this family only has tiles up to 128x128 and is meant for the few-tile shapes.
//
// Config (compile-time instantiations, chosen per call): tile t (BM x BN, its warp grid and its KW K groups, TILES
// below), split S in {1, 2, 4, 8, 16} (16 is a non-portable cluster size), STAGES in {2, 4, 8} (8 where it fits the
// opt-in shared memory: more bytes in flight for a CTA's long K slice, the tiny-family run).
//
// ABI gemmrl (kernels/cuda_source.py), layout tn: A row-major [M,K] (lda), B as B^T row-major [N,K] (ldb), C
// row-major [M,N] (ldc). cp.async needs 16-byte aligned A and B and K, lda, ldb multiples of 8; M and N are free
// (a tile's rows past M or N load row 0 and are never stored; stores predicated; a K tail is zero-filled). Entry
// points: gemmrl_tiny_gemm (an explicit config, kernels/tiny_gemm.py), gemmrl_gemm (a heuristic config),
// gemmrl_tiny_plan / _plan_run / _plan_free
// (a prepared shape: what the hot path calls), gemmrl_tiny_smem_bytes and gemmrl_tiny_max_active_clusters (the validity
// predicate's device-side facts).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <utility>

#ifndef GEMMRL_BF16
#define GEMMRL_BF16 0
#endif
#if GEMMRL_BF16
#define AB_PTX "bf16"
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ elem2_t pack2(float a, float b) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ elem_t pack1(float a) { return __float2bfloat16_rn(a); }
#else
#define AB_PTX "f16"
typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ elem2_t pack2(float a, float b) { return __floats2half2_rn(a, b); }
__device__ __forceinline__ elem_t pack1(float a) { return __float2half_rn(a); }
#endif

namespace cg = cooperative_groups;

namespace {

constexpr int BK = 64;
constexpr int LDS = BK + 8;  // elements per shared row: 144 bytes, so ldmatrix's 8 rows hit 8 distinct banks

// tile t: BM x BN over a WARPS_M x WARPS_N grid of warps (each warp BM/WARPS_M x BN/WARPS_N, multiples of 16), times
// KW warp groups that split each 64-deep K step between them (sliced K: group g takes 16-deep slices g*4/KW ..; their
// partial tiles are summed in shared memory after the main loop). The tiny K-step run: ncu had one CTA's warps issue-bound
// (~4 cycles an instruction, 2 warps on 4 schedulers); KW groups split the ldmatrix/mma chain and the loads over KW
// times the warps. Measured: 16x32 and 32x32 steps ~4-5% faster with 2 groups, 64x64 7% slower (its step is the SM's
// shared-memory traffic and HMMA rate, not one warp's chain; docs/measurements.md, the tiny K-step run).
template <int T> struct Tile;
#define GEMMRL_TILE(T_, BM_, BN_, WM_, WN_, KW_)                                              \
  template <> struct Tile<T_> {                                                                \
    static constexpr int BM = BM_, BN = BN_, WARPS_M = WM_, WARPS_N = WN_, KW = KW_;           \
    static constexpr int THREADS = 32 * WM_ * WN_ * KW_;                                       \
  };
GEMMRL_TILE(0, 16, 32, 1, 2, 1)
GEMMRL_TILE(1, 16, 64, 1, 4, 1)
GEMMRL_TILE(2, 32, 32, 2, 2, 1)
GEMMRL_TILE(3, 32, 64, 2, 2, 1)
GEMMRL_TILE(4, 64, 32, 4, 1, 1)
GEMMRL_TILE(5, 64, 64, 2, 2, 1)
GEMMRL_TILE(6, 64, 128, 2, 4, 1)
GEMMRL_TILE(7, 128, 64, 4, 2, 1)
GEMMRL_TILE(8, 128, 128, 2, 4, 1)
GEMMRL_TILE(9, 16, 32, 1, 2, 2)
GEMMRL_TILE(10, 16, 64, 1, 4, 2)
GEMMRL_TILE(11, 32, 32, 2, 2, 2)
GEMMRL_TILE(12, 32, 64, 2, 2, 2)
GEMMRL_TILE(13, 64, 32, 4, 1, 2)
GEMMRL_TILE(14, 64, 64, 2, 2, 2)
GEMMRL_TILE(15, 16, 32, 1, 2, 4)
GEMMRL_TILE(16, 32, 32, 2, 2, 4)
#undef GEMMRL_TILE
constexpr int NTILES = 17;

template <int T>
__host__ __device__ constexpr int pipe_bytes(int stages) { return stages * (Tile<T>::BM + Tile<T>::BN) * LDS * 2; }
template <int T>
__host__ __device__ constexpr int part_bytes() { return Tile<T>::BM * (Tile<T>::BN + 4) * 4; }
template <int T, int S, int STAGES>
constexpr int smem_bytes() {  // the ring, then (S > 1) the partials the cluster pushes here and the mbarrier they
  return pipe_bytes<T>(STAGES) + (S > 1 ? part_bytes<T>() + 8 : 0);  // complete on, a region of their own
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
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB_PTX "." AB_PTX ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the cp.async loads of one K step, set up once per CTA: thread x copies chunks x, x + THREADS, ... of the stage's
// (BM + BN) rows of 8 16-byte chunks; per chunk a global pointer that walks the CTA's K slice (a row past M or N reads
// row 0 instead: valid memory, and only output rows and columns that are never stored see it) and its shared-memory
// offset. A whole step is then one add for the slot, a 64-bit pointer bump and one cp.async a chunk, no predicate;
// only a last step shorter than BK (K % 64 != 0) takes the predicated path. (The tiny-family run: the loop that recomputed rows
// and 64-bit offsets every step ran ~0.12 us per chunk per thread; the tiny K-step run: ncu had the warps issue-bound, ~8
// instructions a chunk for the K predicate and the offset arithmetic, so those went too.)
template <int T>
struct Loader {
  static constexpr int BM = Tile<T>::BM, BN = Tile<T>::BN, THREADS = Tile<T>::THREADS, CPR = BK / 8;
  static constexpr int CHUNKS = (BM + BN) * CPR, PER = (CHUNKS + THREADS - 1) / THREADS;
  static constexpr bool RAGGED = CHUNKS % THREADS != 0;  // the last round of chunks leaves some threads out
  static constexpr unsigned STAGE_BYTES = (BM + BN) * LDS * 2;
  const elem_t* src[PER];
  unsigned dst[PER];
  bool last;  // RAGGED: this thread has a chunk in the last round

  __device__ __forceinline__ Loader(const elem_t* A, const elem_t* Bt, int M, int N, int lda, int ldb, int m0, int n0,
                                    int k_begin, const elem_t* smem) {
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    last = threadIdx.x + (PER - 1) * THREADS < CHUNKS;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = min(threadIdx.x + j * THREADS, CHUNKS - 1), r = i / CPR, c = (i % CPR) * 8;
      const bool is_a = r < BM;
      const int g = is_a ? m0 + r : n0 + r - BM;
      const bool live = g < (is_a ? M : N);
      src[j] = (is_a ? A + size_t(live ? g : 0) * lda : Bt + size_t(live ? g : 0) * ldb) + k_begin + c;
      dst[j] = base + (r * LDS + c) * 2;
    }
  }

  // the next K step into stage ``slot``; ``k_left`` columns of it lie inside the slice (>= BK: a whole step)
  __device__ __forceinline__ void load(int slot, int k_left) {
    const unsigned off = slot * STAGE_BYTES;
    if (k_left >= BK) {
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        if (!RAGGED || j + 1 < PER || last)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst[j] + off), "l"(src[j]));
        src[j] += BK;
      }
    } else {  // the slice's last, short step: columns past it are zero-filled
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        const int col = (threadIdx.x + j * THREADS) % CPR * 8;
        if (!RAGGED || j + 1 < PER || last)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst[j] + off),
                       "l"(col < k_left ? src[j] : src[j] - col), "r"(col < k_left ? 16 : 0));
        src[j] += BK;
      }
    }
  }
};

// STAGED (split 1 only): C through shared memory in 16-byte chunks. Its instantiations ask ptxas for one CTA a SM
// (minBlocks 1): without it ptxas gave 64x64_st4 72 registers and spilled; the others keep minBlocks unset (0), and
// their PTX is the tiny second-split run kernels' own (checked: identical bodies, the same registers)
template <int T, int S, int STAGES, bool STAGED = false>
__global__ void __launch_bounds__(Tile<T>::THREADS, STAGED ? 1 : 0)
    tiny_splitk_kernel(const elem_t* __restrict__ A, const elem_t* __restrict__ Bt, elem_t* __restrict__ C, int M,
                       int N, int K, int lda, int ldb, int ldc, int k_per) {
  constexpr int BM = Tile<T>::BM, BN = Tile<T>::BN, THREADS = Tile<T>::THREADS;
  constexpr int WM = BM / Tile<T>::WARPS_M, WN = BN / Tile<T>::WARPS_N;
  constexpr int MI = WM / 16, NJ = WN / 8;  // m16 and n8 fragments per warp
  constexpr int STAGE = (BM + BN) * LDS;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles are multiples of 16");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  elem_t* smem = reinterpret_cast<elem_t*>(smem_raw);
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * k_per;
  const int k_end = min(K, k_begin + k_per);
  const int nk = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
  constexpr int KW = Tile<T>::KW, GROUP = 32 * Tile<T>::WARPS_M * Tile<T>::WARPS_N;  // threads of one K group
  constexpr int SLICES = BK / 16 / KW;  // 16-deep slices of a K step per group
  static_assert(SLICES >= 1, "at most 4 K groups");
  const int lane = threadIdx.x % 32, kw = threadIdx.x / GROUP, warp = (threadIdx.x % GROUP) / 32;
  const int wm = (warp / Tile<T>::WARPS_N) * WM, wn = (warp % Tile<T>::WARPS_N) * WN;

  if constexpr (S > 1) {
    // the receive region's mbarrier: one arrival (this thread's, now) and the tile's BM x BN fp32 partials in bytes,
    // which the S CTAs' st.async complete; then the cluster's start barrier: arrive now, wait after the main loop
    if (threadIdx.x == 0) {
      const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(smem_raw + pipe_bytes<T>(STAGES) +
                                                                          part_bytes<T>()));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar));
      asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
                   "r"(Tile<T>::BM * Tile<T>::BN * 4)
                   : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  }

  float acc[MI][NJ][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  Loader<T> loader(A, Bt, M, N, lda, ldb, m0, n0, k_begin, smem);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) loader.load(s, k_end - k_begin - s * BK);
    cp_async_commit();
  }
  // this lane's ldmatrix rows in stage 0 (a stage's are these plus its offset): A rows of its m16 fragments, B rows
  // of its pairs of n8 fragments
  const elem_t* a_frag = smem + (wm + (lane % 16)) * LDS + (lane / 16) * 8;
  const elem_t* b_frag = smem + (BM + wn + (lane % 8) + (lane / 16) * 8) * LDS + ((lane / 8) % 2) * 8;
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nxt = kt + STAGES - 1;  // refill the slot consumed in the previous iteration (free after the barrier)
    if (nxt < nk) loader.load(nxt % STAGES, k_end - k_begin - nxt * BK);
    cp_async_commit();
    const elem_t* sa = a_frag + (kt % STAGES) * STAGE + kw * SLICES * 16;
    const elem_t* sb = b_frag + (kt % STAGES) * STAGE + kw * SLICES * 16;
    // fragments double-buffered over the 16-deep slices: slice kk + 1's ldmatrix is written before slice kk's MMAs
    // (ptxas may still schedule each ldmatrix next to its HMMA; it did for 16x32 in the tiny K-step run)
    uint32_t af[2][MI][4], bf[2][NJ / 2][4];
    auto fetch = [&](int buf, int kk) {
#pragma unroll
      for (int i = 0; i < MI; ++i) ldmatrix_x4(af[buf][i], sa + i * 16 * LDS + kk);
#pragma unroll
      for (int j = 0; j < NJ / 2; ++j) ldmatrix_x4(bf[buf][j], sb + j * 16 * LDS + kk);
    };
    fetch(0, 0);
#pragma unroll
    for (int q = 0; q < SLICES; ++q) {
      if (q + 1 < SLICES) fetch((q + 1) % 2, (q + 1) * 16);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
          mma16816(acc[i][j], af[q % 2][i], bf[q % 2][j / 2][(j % 2) * 2], bf[q % 2][j / 2][(j % 2) * 2 + 1]);
    }
  }

  if constexpr (KW > 1) {  // sum the K groups' partial tiles into group 0 through the (now idle) ring
    constexpr int E = MI * NJ * 4;  // accumulators per thread; stored element-major, conflict-free
    float* red = reinterpret_cast<float*>(smem_raw);
    static_assert((KW - 1) * E * GROUP * 4 <= pipe_bytes<T>(STAGES), "the ring holds the K groups' partials");
    cp_async_wait<0>();
    __syncthreads();  // every group is done reading the ring
    const int t = threadIdx.x % GROUP;
    if (kw > 0) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[((kw - 1) * E + (i * NJ + j) * 4 + e) * GROUP + t] = acc[i][j][e];
    }
    __syncthreads();
    if (kw == 0) {
#pragma unroll
      for (int g = 1; g < KW; ++g)  // in group order: deterministic
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] += red[((g - 1) * E + (i * NJ + j) * 4 + e) * GROUP + t];
    }
  }

  if constexpr (S == 1) {
    if constexpr (STAGED) {  // the tile through the idle ring, then whole 16-byte chunks of C rows (all threads)
      constexpr int LDT = BN + 8;  // elements per staged row: 16-byte aligned rows, conflict-free 4-byte writes
      static_assert(BM * LDT * 2 <= pipe_bytes<T>(STAGES), "the ring holds the staged tile");
      elem_t* tile = reinterpret_cast<elem_t*>(smem_raw);
      cp_async_wait<0>();
      __syncthreads();  // every warp is done reading the ring (and, with KW > 1, group 0 has the sums)
      if (kw == 0) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              *reinterpret_cast<elem2_t*>(tile + (wm + i * 16 + lane / 4 + h * 8) * LDT + wn + j * 8 + (lane % 4) * 2) =
                  pack2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
      __syncthreads();
      const bool vec = (ldc % 8) == 0 && (reinterpret_cast<uintptr_t>(C) & 15) == 0;
      for (int idx = threadIdx.x; idx < BM * (BN / 8); idx += THREADS) {
        const int r = idx / (BN / 8), c = (idx % (BN / 8)) * 8, gm = m0 + r, gn = n0 + c;
        if (gm >= M || gn >= N) continue;
        const elem_t* src = tile + r * LDT + c;
        elem_t* out = C + size_t(gm) * ldc + gn;
        if (vec && gn + 8 <= N) {
          *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < 8 && gn + e < N; ++e) out[e] = src[e];
        }
      }
      return;
    }
    // each quad of lanes holds 8 contiguous columns of a row: 4-byte stores, no staging
    if (kw > 0) return;  // group 0 holds the tile
    const bool pairs = (ldc % 2) == 0 && (reinterpret_cast<uintptr_t>(C) & 3) == 0;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m0 + wm + i * 16 + lane / 4 + h * 8, c = n0 + wn + j * 8 + (lane % 4) * 2;
          if (r >= M) continue;
          elem_t* out = C + size_t(r) * ldc + c;
          if (pairs && c + 1 < N) {
            *reinterpret_cast<elem2_t*>(out) = pack2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          } else {
            if (c < N) out[0] = pack1(acc[i][j][2 * h]);
            if (c + 1 < N) out[1] = pack1(acc[i][j][2 * h + 1]);
          }
        }
  } else {
    // push, no barrier: CTA q owns rows [q*ROWS, (q+1)*ROWS) of the tile; every CTA st.async-es its fp32 partial of
    // those rows into q's receive region (slot = the sender's rank), each store completing bytes on q's mbarrier, so
    // q waits for exactly its own rows' bytes and sums its slots in rank order (deterministic) from its own shared
    // memory. No remote load, and no cluster barrier after the start (the tiny-family run: the pull version, loads from every
    // peer between two full barriers, cost ~1.3 us over an unsplit call at 64_64_256; its push with plain stores and a
    // release/acquire cluster barrier ~0.5 us; the tiny K-step run: st.async + the receiver's mbarrier).
    constexpr int LDP = BN + 4, ROWS = BM / S;  // floats per partial row; rows each CTA owns
    static_assert(BM % S == 0, "every CTA owns whole rows");
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    float* recv = reinterpret_cast<float*>(smem_raw + pipe_bytes<T>(STAGES));
    const unsigned recv_s = static_cast<unsigned>(__cvta_generic_to_shared(recv));
    const unsigned bar_s = recv_s + part_bytes<T>();
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");  // every peer has started: its mbarrier is set up
    if (kw == 0) {  // group 0 holds the tile; every thread still sums below
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = wm + i * 16 + lane / 4 + h * 8, c = wn + j * 8 + (lane % 4) * 2, q = r / ROWS;
            unsigned dst, bar;
            asm("mapa.shared::cluster.u32 %0, %1, %2;\n"
                : "=r"(dst)
                : "r"(recv_s + ((rank * ROWS + r - q * ROWS) * LDP + c) * 4), "r"(q));
            asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(bar) : "r"(bar_s), "r"(q));
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(
                             dst),
                         "f"(acc[i][j][2 * h]), "f"(acc[i][j][2 * h + 1]), "r"(bar)
                         : "memory");
          }
    }
    for (unsigned done = 0; !done;)  // every sender's bytes of this CTA's rows have landed
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(bar_s)
          : "memory");
    const bool quads = (ldc % 4) == 0 && (reinterpret_cast<uintptr_t>(C) & 7) == 0;
    for (int idx = threadIdx.x; idx < ROWS * (BN / 4); idx += THREADS) {
      const int lr = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
      float4 s = *reinterpret_cast<const float4*>(recv + lr * LDP + c);
#pragma unroll
      for (int q = 1; q < S; ++q) {  // rank order: the same sum whoever finishes first
        const float4 v = *reinterpret_cast<const float4*>(recv + (q * ROWS + lr) * LDP + c);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      const int gm = m0 + rank * ROWS + lr, gn = n0 + c;
      if (gm >= M) continue;
      elem_t* out = C + size_t(gm) * ldc + gn;
      if (quads && gn + 3 < N) {
        elem2_t lo2 = pack2(s.x, s.y), hi2 = pack2(s.z, s.w);
        *reinterpret_cast<uint2*>(out) =
            make_uint2(*reinterpret_cast<uint32_t*>(&lo2), *reinterpret_cast<uint32_t*>(&hi2));
      } else {
        const float vals[4] = {s.x, s.y, s.z, s.w};
        for (int e = 0; e < 4; ++e)
          if (gn + e < N) out[e] = pack1(vals[e]);
      }
    }
  }
}

typedef void (*KernelFn)(const elem_t*, const elem_t*, elem_t*, int, int, int, int, int, int, int);

// the kernel's attributes, set once per instantiation: its shared memory, and clusters of 16 (non-portable)
template <int T, int S, int STAGES, bool STAGED = false>
cudaError_t configure() {
  static const cudaError_t status = [] {
    cudaError_t e = cudaFuncSetAttribute(tiny_splitk_kernel<T, S, STAGES, STAGED>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<T, S, STAGES>());
    if (e == cudaSuccess && S > 8)
      e = cudaFuncSetAttribute(tiny_splitk_kernel<T, S, STAGES, STAGED>,
                               cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
  }();
  return status;
}

// a launch of ``grid`` whose clusters are the ``split`` CTAs along z (``attr`` must outlive ``cfg``'s use)
cudaLaunchConfig_t launch_config(dim3 grid, unsigned threads, int smem, int split, cudaStream_t stream,
                                 cudaLaunchAttribute (&attr)[1]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = split;
  cfg.attrs = attr;
  cfg.numAttrs = split > 1 ? 1 : 0;
  return cfg;
}

template <int T, int S, int STAGES>
struct Clusters {
  static int run() {
    cudaError_t e = configure<T, S, STAGES>();
    int n = 0;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg =
        launch_config(dim3(1, 1, S), Tile<T>::THREADS, smem_bytes<T, S, STAGES>(), S, nullptr, attr);
    cfg.numAttrs = 1;  // the occupancy of clusters needs the cluster dimension, 1 x 1 x 1 included
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&n, tiny_splitk_kernel<T, S, STAGES>, &cfg);
    return e == cudaSuccess ? n : -static_cast<int>(e);
  }
  static int bad() { return -static_cast<int>(cudaErrorInvalidValue); }
};

template <int T, int S, int STAGES>
struct Smem {
  static int run() { return smem_bytes<T, S, STAGES>(); }
  static int bad() { return -1; }
};

// one switch over the instantiated configs: F<T, S, STAGES>::run(args...)
template <template <int, int, int> class F, class... Args>
auto dispatch(int t, int s, int stages, Args... args) -> decltype(F<0, 1, 2>::run(args...)) {
#define GEMMRL_CASE_ST(T_, S_)                        \
  switch (stages) {                                   \
    case 2: return F<T_, S_, 2>::run(args...);        \
    case 4: return F<T_, S_, 4>::run(args...);        \
    case 8: return F<T_, S_, 8>::run(args...);        \
    default: return F<0, 1, 2>::bad();                \
  }
#define GEMMRL_CASE_S(T_)                             \
  switch (s) {                                        \
    case 1: GEMMRL_CASE_ST(T_, 1)                     \
    case 2: GEMMRL_CASE_ST(T_, 2)                     \
    case 4: GEMMRL_CASE_ST(T_, 4)                     \
    case 8: GEMMRL_CASE_ST(T_, 8)                     \
    case 16: GEMMRL_CASE_ST(T_, 16)                   \
    default: return F<0, 1, 2>::bad();                \
  }
  switch (t) {
    case 0: GEMMRL_CASE_S(0)
    case 1: GEMMRL_CASE_S(1)
    case 2: GEMMRL_CASE_S(2)
    case 3: GEMMRL_CASE_S(3)
    case 4: GEMMRL_CASE_S(4)
    case 5: GEMMRL_CASE_S(5)
    case 6: GEMMRL_CASE_S(6)
    case 7: GEMMRL_CASE_S(7)
    case 8: GEMMRL_CASE_S(8)
    case 9: GEMMRL_CASE_S(9)
    case 10: GEMMRL_CASE_S(10)
    case 11: GEMMRL_CASE_S(11)
    case 12: GEMMRL_CASE_S(12)
    case 13: GEMMRL_CASE_S(13)
    case 14: GEMMRL_CASE_S(14)
    case 15: GEMMRL_CASE_S(15)
    case 16: GEMMRL_CASE_S(16)
    default: return F<0, 1, 2>::bad();
  }
#undef GEMMRL_CASE_ST
#undef GEMMRL_CASE_S
}

// a prepared call (the hot path's spec kind 2, like the CUTLASS family's plans): the instantiation, grid and
// slice chosen once per shape, so a call is one cudaLaunchKernelEx
struct Plan {
  KernelFn fn;
  dim3 grid;
  unsigned threads;
  int smem, split, M, N, K, lda, ldb, ldc, k_per;
};

template <int T, int S, int STAGES>
struct MakePlan {
  static Plan* run(int M, int N, int K, int lda, int ldb, int ldc, int staged) {
    const bool st = S == 1 && staged;  // C through shared memory: its own instantiation (a split was refused before)
    if ((st ? configure<T, 1, STAGES, true>() : configure<T, S, STAGES>()) != cudaSuccess) return nullptr;
    const KernelFn fn = st ? tiny_splitk_kernel<T, 1, STAGES, true> : tiny_splitk_kernel<T, S, STAGES>;
    const int k_per = ((K + S * BK - 1) / (S * BK)) * BK;  // whole BK steps per CTA; the last slice may be shorter
    return new Plan{fn,
                    dim3((N + Tile<T>::BN - 1) / Tile<T>::BN, (M + Tile<T>::BM - 1) / Tile<T>::BM, S),
                    static_cast<unsigned>(Tile<T>::THREADS), smem_bytes<T, S, STAGES>(), S, M, N, K, lda, ldb, ldc,
                    k_per};
  }
  static Plan* bad() { return nullptr; }
};

cudaError_t run_plan(const Plan& p, const void* A, const void* B, void* C, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = launch_config(p.grid, p.threads, p.smem, p.split, stream, attr);
  return cudaLaunchKernelEx(&cfg, p.fn, static_cast<const elem_t*>(A), static_cast<const elem_t*>(B),
                            static_cast<elem_t*>(C), p.M, p.N, p.K, p.lda, p.ldb, p.ldc, p.k_per);
}

template <int T>
bool is_tile(int bm, int bn, int kw) {
  return Tile<T>::BM == bm && Tile<T>::BN == bn && Tile<T>::KW == kw;
}

template <int... Ts>
int find_tile(int bm, int bn, int kw, std::integer_sequence<int, Ts...>) {
  int t = -1;
  ((t < 0 && is_tile<Ts>(bm, bn, kw) ? (t = Ts) : 0), ...);
  return t;
}

// the instantiated tile of bm x bn with kw K groups, or -1
int tile_of(int bm, int bn, int kw) { return find_tile(bm, bn, kw, std::make_integer_sequence<int, NTILES>{}); }

bool operands_ok(const void* A, const void* B, int M, int N, int K, int lda, int ldb, int ldc) {
  return M > 0 && N > 0 && K > 0 && K % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && lda >= K && ldb >= K && ldc >= N &&
         ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) & 15) == 0;
}

}  // namespace

// an explicit config: tile bm x bn with kw K groups (one of the instantiated), cluster split s, ring depth stages,
// staged (1: split 1 stores C through shared memory in 16-byte chunks); 0 or a cudaError_t
extern "C" int gemmrl_tiny_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                                cudaStream_t stream, int bm, int bn, int s, int stages, int kw, int staged) {
  const int t = tile_of(bm, bn, kw);
  if (t < 0 || !operands_ok(A, B, M, N, K, lda, ldb, ldc) || s > (K + BK - 1) / BK || (staged && s != 1))
    return static_cast<int>(cudaErrorInvalidValue);
  Plan* p = dispatch<MakePlan>(t, s, stages, M, N, K, lda, ldb, ldc, staged);
  if (!p) return static_cast<int>(cudaErrorInvalidValue);
  const cudaError_t e = run_plan(*p, A, B, C, stream);
  delete p;
  return static_cast<int>(e);
}

// a plan for repeated calls at one shape (nullptr: a config or operand shape the kernel does not take); run it with
// gemmrl_tiny_plan_run(plan, A, B, C, stream) -> 0 or a cudaError_t, free it with gemmrl_tiny_plan_free
extern "C" void* gemmrl_tiny_plan(int M, int N, int K, int lda, int ldb, int ldc, int bm, int bn, int s, int stages,
                                  int kw, int staged) {
  const int t = tile_of(bm, bn, kw);
  if (t < 0 || M <= 0 || N <= 0 || K <= 0 || K % 8 || lda % 8 || ldb % 8 || lda < K || ldb < K || ldc < N ||
      s > (K + BK - 1) / BK || (staged && s != 1))
    return nullptr;
  return dispatch<MakePlan>(t, s, stages, M, N, K, lda, ldb, ldc, staged);
}

extern "C" int gemmrl_tiny_plan_run(void* plan, const void* A, const void* B, void* C, cudaStream_t stream) {
  if (!plan || ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) & 15))
    return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(run_plan(*static_cast<Plan*>(plan), A, B, C, stream));
}

extern "C" void gemmrl_tiny_plan_free(void* plan) { delete static_cast<Plan*>(plan); }

// clusters of this config that fit on the device at once (> 0), 0 if none, < 0 an error
extern "C" int gemmrl_tiny_max_active_clusters(int bm, int bn, int s, int stages, int kw) {
  const int t = tile_of(bm, bn, kw);
  return t < 0 ? -static_cast<int>(cudaErrorInvalidValue) : dispatch<Clusters>(t, s, stages);
}

extern "C" int gemmrl_tiny_smem_bytes(int bm, int bn, int s, int stages, int kw) {
  const int t = tile_of(bm, bn, kw);
  return t < 0 ? -1 : dispatch<Smem>(t, s, stages);
}

// the default config for gemmrl_gemm: 64x64 tiles (32-row where M is small), the split that fills the SMs with at
// least one K step per CTA (16-CTA clusters only for at most 7 tiles), the deeper ring
extern "C" int gemmrl_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;
  if (!operands_ok(A, B, M, N, K, lda, ldb, ldc)) return static_cast<int>(cudaErrorInvalidValue);
  const int bm = M <= 32 ? 32 : 64, bn = 64;
  const int tiles = ((M + bm - 1) / bm) * ((N + bn - 1) / bn), ktiles = (K + BK - 1) / BK;
  int s = 1;
  for (int c = 2; c <= 16; c *= 2)
    if (tiles * c <= 132 && ktiles >= c && (c < 16 || tiles <= 7)) s = c;
  return gemmrl_tiny_gemm(A, B, C, M, N, K, lda, ldb, ldc, stream, bm, bn, s, 4, 1, 0);
}
