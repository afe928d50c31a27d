// Kernels for benchmarks/acceptance/pace_probe.py: how fast one CTA streams a GEMM's K slices from L2 into a shared-memory ring,
// by load method (the tiny family's per-step floor, NOTES the tiny-family run section 5: ~8 KB per 0.2 us step, ~35 GB/s a CTA,
// whatever the warp count).
//
// Each CTA reads ROWS rows of 128 bytes (64 fp16 = one K step of a BM + BN tile) per step from a row-major
// [rows_total, 4096] fp16 buffer, `steps` steps, through a STAGES-deep ring, and touches 16 bytes a thread per step
// (a consumer that costs nothing, so the loads set the pace). Methods:
//   0  cp.async.cg 16 B a thread (the tiny family's Loader), cp.async.wait_group + __syncthreads a step
//   1  cp.async.bulk (1-D TMA) of each 128-byte row, issued by warp 0's lanes, an mbarrier a stage
//   2  cp.async.bulk.tensor.2d (TMA) boxes of 64 x ROWS/2 (the A box and the B box), issued by one thread, an
//      mbarrier a stage, 128-byte swizzle
//   3, 4  cp.async.bulk.tensor.3d boxes of KC = 4 64-deep K chunks of ROWS/2 rows each (the A box and the B box), a
//      step being KC chunks (the tiny second-split run: does the per-box cost, not the bytes, set TMA's ~0.15 us a step floor?).
//      Method 3 views the buffer as dims {64, rows, 64 chunks} with strides {row, 128 bytes}, so a box lands as KC
//      consecutive [ROWS/2][64] swizzled tiles (what a wgmma mainloop needs; the strides are not increasing, which
//      the driver may refuse: pace_make_map's status says). Method 4 views it as {64, 64 chunks, rows}, strides
//      {128 bytes, row}: a plain tensor, the box landing as [ROWS/2][KC][64]. Chunks wrap around the buffer's 64.
// A launch is `grid` CTAs, in clusters of `cluster` along x (1: none); CTA g reads rows g*ROWS.. (mod rows_total).
// Entry: pace_run(method, rows, threads, stages, grid, cluster, steps, buf, rows_total, out, map, stream) -> 0 or a
// cudaError_t (cudaErrorInvalidValue: a combination not instantiated); pace_make_map builds method 2-4's tensor map
// (pace_kc(method): the K chunks a step of that method loads).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int KCOLS = 4096;  // the buffer's row length in elements (steps <= 64)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

constexpr int kc_of(int method) { return method >= 3 ? 4 : 1; }  // K chunks a step

template <int METHOD, int ROWS, int THREADS, int STAGES>
struct Cfg {
  static constexpr bool TMA = METHOD >= 2;
  static constexpr int KC = kc_of(METHOD);
  static constexpr int ROWB = TMA ? 128 : 144;  // bytes per shared row (padded for ldmatrix but for TMA)
  static constexpr int STAGE = ROWS * ROWB * KC;
  static constexpr int SMEM = 1024 + STAGES * STAGE + 8 * STAGES;
};

template <int METHOD, int ROWS, int THREADS, int STAGES>
__global__ void __launch_bounds__(THREADS)
    pace_kernel(const __half* __restrict__ buf, int rows_total, int steps, uint32_t* out,
                const __grid_constant__ CUtensorMap map) {
  using C = Cfg<METHOD, ROWS, THREADS, STAGES>;
  extern __shared__ unsigned char raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * C::STAGE);
  const int row0 = (blockIdx.x % (rows_total / ROWS)) * ROWS;  // whole row blocks inside the buffer
  const int tid = threadIdx.x;
  uint32_t acc = 0;

  // method 0: per-thread chunk pointers, set once (the tiny family's Loader)
  constexpr int PER = ROWS * 8 / THREADS;
  const __half* src[PER > 0 ? PER : 1];
  uint32_t dst[PER > 0 ? PER : 1];
  if constexpr (METHOD == 0) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = tid + j * THREADS, r = i / 8, c = (i % 8) * 8;
      src[j] = buf + size_t(row0 + r) * KCOLS + c;
      dst[j] = smem_u32(smem) + r * C::ROWB + c * 2;
    }
  } else {
    if (tid == 0) {
      for (int s = 0; s < STAGES; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(full + s)));
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      if constexpr (C::TMA)
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
    }
    __syncthreads();
  }

  auto issue = [&](int step) {
    const int slot = step % STAGES;
    if constexpr (METHOD == 0) {
#pragma unroll
      for (int j = 0; j < PER; ++j)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst[j] + slot * C::STAGE),
                     "l"(src[j] + step * 64));
    } else if constexpr (METHOD == 1) {
      if (tid < 32) {
        if (tid == 0) mbar_expect_tx(full + slot, ROWS * 128);
        __syncwarp();
        for (int r = tid; r < ROWS; r += 32)
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 128, [%2];\n" ::"r"(
                  smem_u32(smem + slot * C::STAGE + r * C::ROWB)),
              "l"(buf + size_t(row0 + r) * KCOLS + step * 64), "r"(smem_u32(full + slot))
              : "memory");
      }
    } else if constexpr (METHOD == 2) {
      if (tid == 0) {
        mbar_expect_tx(full + slot, ROWS * 128);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
              "[%4];\n" ::"r"(smem_u32(smem + slot * C::STAGE + h * (ROWS / 2) * 128)),
              "l"(reinterpret_cast<uint64_t>(&map)), "r"(step * 64), "r"(row0 + h * (ROWS / 2)),
              "r"(smem_u32(full + slot))
              : "memory");
      }
    } else {
      if (tid == 0) {
        mbar_expect_tx(full + slot, ROWS * 128 * C::KC);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          asm volatile(
              "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
              "%4}], [%5];\n" ::"r"(smem_u32(smem + slot * C::STAGE + h * (ROWS / 2) * 128 * C::KC)),
              "l"(reinterpret_cast<uint64_t>(&map)), "r"(0),
              "r"(METHOD == 3 ? row0 + h * (ROWS / 2) : (step * C::KC) % (KCOLS / 64)),
              "r"(METHOD == 3 ? (step * C::KC) % (KCOLS / 64) : row0 + h * (ROWS / 2)), "r"(smem_u32(full + slot))
              : "memory");
      }
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) issue(s);
    if constexpr (METHOD == 0) asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int kt = 0; kt < steps; ++kt) {
    if constexpr (METHOD == 0)
      asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    else
      mbar_wait(full + kt % STAGES, (kt / STAGES) & 1);
    __syncthreads();
    const int nxt = kt + STAGES - 1;
    if (nxt < steps) issue(nxt);
    if constexpr (METHOD == 0) asm volatile("cp.async.commit_group;\n" ::);
    const uint4 v = *reinterpret_cast<const uint4*>(smem + (kt % STAGES) * C::STAGE + (tid * 16) % C::STAGE);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads; never true for the zero-filled buffer
}

template <int METHOD, int ROWS, int THREADS, int STAGES>
int launch(int grid, int cluster, int steps, const void* buf, int rows_total, void* out, const CUtensorMap* map,
           cudaStream_t stream) {
  using C = Cfg<METHOD, ROWS, THREADS, STAGES>;
  auto fn = pace_kernel<METHOD, ROWS, THREADS, STAGES>;
  static const cudaError_t set = [&] {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
  }();
  if (set != cudaSuccess) return static_cast<int>(set);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3(grid, 1, 1);
  cfg.blockDim = dim3(THREADS, 1, 1);
  cfg.dynamicSmemBytes = C::SMEM;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  CUtensorMap none = {};
  return static_cast<int>(cudaLaunchKernelEx(&cfg, fn, static_cast<const __half*>(buf), rows_total, steps,
                                             static_cast<uint32_t*>(out), map ? *map : none));
}

}  // namespace

// the instantiated (method, rows, threads, stages); pace_configs writes them as 4 ints each, returns the count
#define PACE_CONFIGS(X)                                                                                         \
  X(0, 48, 64, 4) X(0, 48, 64, 8) X(0, 48, 128, 8) X(0, 96, 64, 4) X(0, 128, 128, 4) X(0, 128, 128, 8)          \
      X(0, 128, 256, 8) X(0, 256, 256, 4) X(1, 48, 64, 8) X(1, 128, 128, 8) X(1, 256, 256, 4) X(2, 48, 64, 8)     \
          X(2, 128, 128, 8) X(2, 256, 256, 4) X(3, 48, 64, 4) X(3, 128, 128, 3) X(4, 48, 64, 4) X(4, 128, 128, 3)

extern "C" int pace_configs(int* out4) {
  int n = 0;
#define X(m, r, t, s)  \
  out4[4 * n] = m;     \
  out4[4 * n + 1] = r; \
  out4[4 * n + 2] = t; \
  out4[4 * n + 3] = s; \
  ++n;
  PACE_CONFIGS(X)
#undef X
  return n;
}

extern "C" int pace_run(int method, int rows, int threads, int stages, int grid, int cluster, int steps,
                        const void* buf, int rows_total, void* out, const void* map, cudaStream_t stream) {
  if (steps < 1 || steps > KCOLS / 64) return static_cast<int>(cudaErrorInvalidValue);
#define X(m, r, t, s)                                                                                   \
  if (method == m && rows == r && threads == t && stages == s)                                          \
    return launch<m, r, t, s>(grid, cluster, steps, buf, rows_total, out, static_cast<const CUtensorMap*>(map), \
                              stream);
  PACE_CONFIGS(X)
#undef X
  return static_cast<int>(cudaErrorInvalidValue);
}

extern "C" int pace_kc(int method) { return kc_of(method); }

// method 2-4's tensor map over the [rows_total, 4096] buffer, written to `out` (128 bytes, 64-aligned), boxes of
// box_rows rows (the views above); 0 or the driver's CUresult (-1: no driver entry point, -2: not a TMA method)
extern "C" int pace_make_map(void* out, const void* buf, int rows_total, int box_rows, int method) {
  if (method < 2 || method > 4) return -2;
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return -1;
  auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  const cuuint64_t row = cuuint64_t(KCOLS) * 2, chunks = KCOLS / 64, kc = kc_of(method), r = rows_total;
  const cuuint32_t rank = method == 2 ? 2 : 3;
  cuuint64_t dims[3] = {method == 2 ? cuuint64_t(KCOLS) : 64, method == 4 ? chunks : r, method == 4 ? r : chunks};
  cuuint64_t strides[2] = {method == 4 ? 128 : row, method == 4 ? row : 128};
  cuuint32_t box[3] = {64, cuuint32_t(method == 4 ? kc : box_rows), cuuint32_t(method == 4 ? box_rows : kc)};
  cuuint32_t estr[3] = {1, 1, 1};
  return static_cast<int>(fn(static_cast<CUtensorMap*>(out), CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank,
                             const_cast<void*>(buf), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}
