// gemmrl's CUTLASS 3.x SM90 GEMM family: one template, one config per compile (kernels/cutlass_sm90.py
// renders it with -D flags), the problem size and the tile scheduler's knobs are runtime arguments.
//
//   D[M,N] (row-major, fp16/bf16) = A[M,K] (row-major) @ B, fp32 accumulation, no C source (beta = 0).
//   GEMMRL_B_ROW=0: layout "tn", B given as B^T row-major [N,K] (K-major, what nn.Linear's weight is);
//   GEMMRL_B_ROW=1: layout "nn", B row-major [K,N].
//
// Compile-time config (all required):
//   GEMMRL_BF16 (0|1), GEMMRL_B_ROW (0|1), GEMMRL_BM, GEMMRL_BN, GEMMRL_BK, GEMMRL_CM, GEMMRL_CN (cluster),
//   GEMMRL_PINGPONG (0: TMA warp-specialized cooperative, 1: ping-pong), GEMMRL_STREAMK (0: persistent
//   data-parallel scheduler, 1: stream-K scheduler; cooperative only), GEMMRL_SWAP (1: the kernel computes
//   D^T[N,M] = B^T A^T: its problem is (N, M, K), its A is our B, its B is our A (K-major), its D column-major;
//   BM and CM then run along our N. Callers pass the same arguments either way).
// Optional: GEMMRL_STAGES (the pipeline's depth; default: as many stages as shared memory holds), GEMMRL_EPI_NOSMEM
// (1: the epilogue stores from registers, CUTLASS's NoSmemWarpSpecialized; default 0, the TMA store epilogue),
// GEMMRL_EPI_N (the TMA epilogue's subtile width, 64 or 128; default CUTLASS's auto, 32 for a 16-bit D).
// Runtime knobs (gemmrl_cutlass_gemm's last arguments): max swizzle (1, 2, 4, 8; 16 and 32 with the persistent
// scheduler, set past CUTLASS's cap of 8 by widen_swizzle below), raster order (0 heuristic, 1 along M, 2 along
// N), and for stream-K the decomposition (0 heuristic, 1 data-parallel, 2 split-K, 3 stream-K) and the split
// count. Stream-K's reduction is the deterministic one (CUTLASS's default).
//
// Entry points, extern "C" so ctypes loads them without torch:
//   int    gemmrl_cutlass_gemm(A, B, D, M, N, K, lda, ldb, ldd, workspace, workspace_bytes, stream,
//                              swizzle, raster, decomposition, splits)   -> 0, or an error code below
//   size_t gemmrl_cutlass_workspace(M, N, K, swizzle, raster, decomposition, splits)
//   int    gemmrl_cutlass_can_implement(M, N, K, lda, ldb, ldd)                   -> 0 when it can
//   const char* gemmrl_cutlass_describe()
//   void*  gemmrl_cutlass_plan(M, N, K, lda, ldb, ldd, workspace, workspace_bytes, swizzle, raster, decomposition,
//                              splits)                                       -> a plan (free with gemmrl_cutlass_plan_free)
//   int    gemmrl_cutlass_plan_run(plan, A, B, D, stream)                   -> gemmrl_cutlass_gemm's codes
// The plan holds everything but the operands and the stream, so gemmrl.mm's compiled hot path (fastpath_spec.h, spec
// kind 2) calls one C function per call with no Python in between, as it does for cuBLASLt plans.
// Error codes: 1 cannot implement (alignment, sizes), 2 workspace too small, 3 initialize failed,
// 4 launch failed (the CUDA error is in cudaGetLastError), 5 bad knob.
// The launch goes to `stream`; nothing synchronizes, allocates or touches the legacy default stream.
// The last initialized arguments are kept (one entry per process): a call with the same pointers, sizes and
// knobs skips the host-side initialize (TMA descriptors), which is most of this path's host cost; stream-K
// configs initialize on every call (their workspace barriers are zeroed there). Not thread-safe: one
// calling thread per process, as in the harness and a serving stack's stream.

#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <new>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

#if !defined(GEMMRL_BF16) || !defined(GEMMRL_B_ROW) || !defined(GEMMRL_BM) || !defined(GEMMRL_BN) || \
    !defined(GEMMRL_BK) || !defined(GEMMRL_CM) || !defined(GEMMRL_CN) || !defined(GEMMRL_PINGPONG) ||   \
    !defined(GEMMRL_STREAMK) || !defined(GEMMRL_SWAP)
#error "cutlass_sm90_gemm.cu is a template: render it with kernels/cutlass_sm90.py (every GEMMRL_* flag)"
#endif
#if GEMMRL_PINGPONG && GEMMRL_STREAMK
#error "stream-K needs the cooperative schedule"
#endif

using namespace cute;

#if GEMMRL_BF16
using Element = cutlass::bfloat16_t;
#else
using Element = cutlass::half_t;
#endif
using ElementAcc = float;
#if GEMMRL_SWAP
// the kernel's A is our B ([N,K] K-major for tn, N-major for nn), its B our A ([M,K] K-major), its D = D^T
#if GEMMRL_B_ROW
using LayoutA = cutlass::layout::ColumnMajor;
#else
using LayoutA = cutlass::layout::RowMajor;
#endif
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::ColumnMajor;
#else
using LayoutA = cutlass::layout::RowMajor;
#if GEMMRL_B_ROW
using LayoutB = cutlass::layout::RowMajor;
#else
using LayoutB = cutlass::layout::ColumnMajor;
#endif
using LayoutD = cutlass::layout::RowMajor;
#endif
constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA alignment

using TileShape = Shape<Int<GEMMRL_BM>, Int<GEMMRL_BN>, Int<GEMMRL_BK>>;
using ClusterShape = Shape<Int<GEMMRL_CM>, Int<GEMMRL_CN>, _1>;
#ifndef GEMMRL_EPI_NOSMEM
#define GEMMRL_EPI_NOSMEM 0
#endif
#if GEMMRL_EPI_NOSMEM && GEMMRL_STREAMK
#error "the register epilogue (GEMMRL_EPI_NOSMEM) is built with the persistent scheduler only"
#endif
#if GEMMRL_PINGPONG
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#else
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#endif
#if GEMMRL_EPI_NOSMEM
// stores straight from the accumulators' registers: no shared-memory staging, no TMA store and no wait for it
// before the CTA exits (on a tiny problem the epilogue is part of every call's fixed cost)
using EpilogueScheduleUsed = cutlass::epilogue::NoSmemWarpSpecialized;
#else
using EpilogueScheduleUsed = EpilogueSchedule;
#endif
#if GEMMRL_STREAMK
using TileScheduler = cutlass::gemm::StreamKScheduler;
#else
using TileScheduler = cutlass::gemm::PersistentScheduler;
#endif

#ifdef GEMMRL_EPI_N
#if GEMMRL_EPI_NOSMEM
#error "GEMMRL_EPI_N sets the TMA epilogue's subtile: the register epilogue (GEMMRL_EPI_NOSMEM) has none"
#endif
// the TMA epilogue's subtile: as tall as CUTLASS requires (64 rows ping-pong, 128 cooperative), GEMMRL_EPI_N wide
// (64 or 128: whole 128-byte lines of a row-major 16-bit D per store; the auto choice is 32 wide)
using EpilogueTile = Shape<Int<GEMMRL_PINGPONG ? 64 : 128>, Int<GEMMRL_EPI_N>>;
#else
using EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto;
#endif

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    EpilogueTile, ElementAcc, ElementAcc,
    void, LayoutD, kAlign,      // no C source
    Element, LayoutD, kAlign,   // D
    EpilogueScheduleUsed>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign,
    ElementAcc, TileShape, ClusterShape,
#ifdef GEMMRL_STAGES
    cutlass::gemm::collective::StageCount<GEMMRL_STAGES>,  // a cap: tiny tiles fit 17-25 stages, odd counts fail
#else
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
#endif
    MainloopSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, TileScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
using StrideA = typename Gemm::GemmKernel::StrideA;
using StrideB = typename Gemm::GemmKernel::StrideB;
using StrideD = typename Gemm::GemmKernel::StrideD;
using RasterOrder = cutlass::gemm::kernel::detail::RasterOrderOptions;

namespace {

int sm_count(int device) {
  static int cached_device = -1, cached = 0;
  if (device != cached_device) {
    cached = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    cached_device = device;
  }
  return cached;
}

bool make_args(typename Gemm::Arguments& args, const void* A, const void* B, void* D, int M, int N, int K,
               int lda, int ldb, int ldd, int swizzle, int raster, int decomposition, int splits) {
  const bool wide = !GEMMRL_STREAMK && (swizzle == 16 || swizzle == 32);  // widen_swizzle's, persistent only
  if (swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8 && !wide) return false;
  if (raster < 0 || raster > 2 || decomposition < 0 || decomposition > 3 || splits < 1) return false;
#if GEMMRL_SWAP
  // the kernel's problem is (N, M, K): A' = our B as (N,K), B' = our A as (M,K), D' = our D as (N,M)
  StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(N, K, 1));
  StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(M, K, 1));
  StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(N, M, 1));
#if GEMMRL_B_ROW
  get<1>(sa) = ldb;  // B [K,N] row-major as (N,K) N-major: K stride
#else
  get<0>(sa) = ldb;  // B^T [N,K] row-major as (N,K) K-major: N stride
#endif
  get<0>(sb) = lda;  // A [M,K] row-major as (M,K) K-major: M stride
  get<1>(sd) = ldd;  // D [M,N] row-major as (N,M) column-major: M stride
  const void* opA = B;
  const void* opB = A;
  const int pm = N, pn = M;
#else
  StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(M, K, 1));
  StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(N, K, 1));
  StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(M, N, 1));
  get<0>(sa) = lda;  // row-major A: M stride
#if GEMMRL_B_ROW
  get<1>(sb) = ldb;  // B [K,N] row-major as (N,K): K stride
#else
  get<0>(sb) = ldb;  // B^T [N,K] row-major as (N,K): N stride
#endif
  get<0>(sd) = ldd;
  const void* opA = A;
  const void* opB = B;
  const int pm = M, pn = N;
#endif
  int device = 0;
  cudaGetDevice(&device);
  cutlass::KernelHardwareInfo hw{device, sm_count(device)};
  args = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {pm, pn, K, 1},
      {static_cast<const Element*>(opA), sa, static_cast<const Element*>(opB), sb},
      {{1.0f, 0.0f}, nullptr, sd, static_cast<Element*>(D), sd},
      hw};
  args.scheduler.max_swizzle_size = swizzle < 8 ? swizzle : 8;  // wider: widen_swizzle after initialize
  args.scheduler.raster_order = raster == 1 ? RasterOrder::AlongM : raster == 2 ? RasterOrder::AlongN
                                                                                 : RasterOrder::Heuristic;
#if GEMMRL_STREAMK
  using Decomp = cutlass::gemm::kernel::detail::DecompositionMode;
  args.scheduler.splits = splits;
  args.scheduler.decomposition_mode = decomposition == 1 ? Decomp::DataParallel
                                      : decomposition == 2 ? Decomp::SplitK
                                      : decomposition == 3 ? Decomp::StreamK
                                                           : Decomp::Heuristic;
#else
  if (decomposition != 0 || splits != 1) return false;  // knobs of the stream-K scheduler only
#endif
  return true;
}

struct LastCall {
  const void *A = nullptr, *B = nullptr;
  void *D = nullptr, *ws = nullptr;
  int M = -1, N = -1, K = -1, lda = -1, ldb = -1, ldd = -1, swizzle = -1, raster = -1, decomposition = -1,
      splits = -1, device = -1;
  bool same(const LastCall& o) const {
    return A == o.A && B == o.B && D == o.D && ws == o.ws && M == o.M && N == o.N && K == o.K && lda == o.lda &&
           ldb == o.ldb && ldd == o.ldd && swizzle == o.swizzle && raster == o.raster &&
           decomposition == o.decomposition && splits == o.splits && device == o.device;
  }
};

Gemm g_gemm;
LastCall g_last;

#if !GEMMRL_STREAMK
// CUTLASS's persistent scheduler caps its swizzle at 8 (get_log_swizzle_size returns at most 3), yet at
// 16384_16384_4096 ping-pong 64x256 still gained 18% from swizzle 4 to 8 (docs/measurements.md, the 168-wide-tile run): a wave of 132 tiles
// then spans 8 M-tiles x 16.5 N-tiles, ~39 MB of operands. Wider swizzles are set here, after initialize, by
// recomputing the fields the swizzle enters (PersistentTileSchedulerSm90Params::initialize, with the device side's
// get_work_idx_m_and_n unchanged: it takes any log size). The swizzled (minor) dimension is padded to a multiple
// of swizzle x cluster, as CUTLASS pads both: a padded tile is computed on zeros and its store clipped, so the knob
// costs work where the minor tile count is not such a multiple (the screen sees it). The major dimension is left
// unpadded (the device side divides by its count, whatever it is). The launch grid is the scheduler's own (SMs,
// or fewer where the problem has fewer tiles), computed with the capped swizzle; the persistent loop covers any
// tiles past it.
void widen_swizzle(int pm, int pn, int swizzle) {
  auto& sp = const_cast<typename Gemm::Params&>(g_gemm.params()).scheduler;
  using Order = cutlass::gemm::kernel::detail::RasterOrder;
  int log = 0;
  while ((1 << log) < swizzle) ++log;
  const uint64_t cm = GEMMRL_CM, cn = GEMMRL_CN;
  uint64_t bm = (static_cast<uint64_t>(pm) + GEMMRL_BM - 1) / GEMMRL_BM;
  uint64_t bn = (static_cast<uint64_t>(pn) + GEMMRL_BN - 1) / GEMMRL_BN;
  bm = (bm + cm - 1) / cm * cm;
  bn = (bn + cn - 1) / cn * cn;
  const bool along_n = sp.raster_order_ == Order::AlongN;  // along N: N is the major dimension, M the swizzled one
  const uint64_t unit = (uint64_t{1} << log) * (along_n ? cm : cn);
  if (along_n) bm = (bm + unit - 1) / unit * unit;
  else bn = (bn + unit - 1) / unit * unit;
  sp.problem_tiles_m_ = static_cast<uint32_t>(bm / cm);
  sp.problem_tiles_n_ = static_cast<uint32_t>(bn / cn);
  sp.blocks_per_problem_ = bm * bn;  // one batch
  sp.log_swizzle_size_ = log;
  sp.divmod_batch_ = cutlass::FastDivmodU64(bm * bn);
  sp.divmod_cluster_blk_major_ = cutlass::FastDivmodU64(along_n ? bn / cn : bm / cm);
}
#endif

}  // namespace

extern "C" {

const char* gemmrl_cutlass_describe() {
  static char buf[160];
  std::snprintf(buf, sizeof(buf), "%s %s %dx%dx%d cluster %dx%d %s %s%s%s", GEMMRL_BF16 ? "bf16" : "fp16",
                GEMMRL_B_ROW ? "nn" : "tn", GEMMRL_BM, GEMMRL_BN, GEMMRL_BK, GEMMRL_CM, GEMMRL_CN,
                GEMMRL_PINGPONG ? "pingpong" : "cooperative", GEMMRL_STREAMK ? "streamk" : "persistent",
                GEMMRL_SWAP ? " swapped" : "", GEMMRL_EPI_NOSMEM ? " register-epilogue" : "");
  return buf;
}

int gemmrl_cutlass_can_implement(int M, int N, int K, int lda, int ldb, int ldd) {
  typename Gemm::Arguments args;
  if (!make_args(args, nullptr, nullptr, nullptr, M, N, K, lda, ldb, ldd, 1, 0, 0, 1)) return 5;
  return Gemm::can_implement(args) == cutlass::Status::kSuccess ? 0 : 1;
}

size_t gemmrl_cutlass_workspace(int M, int N, int K, int swizzle, int raster, int decomposition, int splits) {
  typename Gemm::Arguments args;
  if (!make_args(args, nullptr, nullptr, nullptr, M, N, K, K, GEMMRL_B_ROW ? N : K, N, swizzle, raster,
                 decomposition, splits))
    return 0;
  return Gemm::get_workspace_size(args);
}

int gemmrl_cutlass_gemm(const void* A, const void* B, void* D, int M, int N, int K, int lda, int ldb, int ldd,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream, int swizzle, int raster,
                        int decomposition, int splits) {
  LastCall call{A, B, D, workspace, M, N, K, lda, ldb, ldd, swizzle, raster, decomposition, splits, 0};
  cudaGetDevice(&call.device);
  // stream-K's initialize also zeroes the workspace's barriers (a memset on `stream`): never skipped
  if (GEMMRL_STREAMK || !call.same(g_last)) {
    typename Gemm::Arguments args;
    if (!make_args(args, A, B, D, M, N, K, lda, ldb, ldd, swizzle, raster, decomposition, splits)) return 5;
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return 1;
    if (Gemm::get_workspace_size(args) > workspace_bytes) return 2;
    g_last = LastCall{};
    if (g_gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return 3;
#if !GEMMRL_STREAMK
    if (swizzle > 8) widen_swizzle(GEMMRL_SWAP ? N : M, GEMMRL_SWAP ? M : N, swizzle);  // swapped: the problem is N, M
#endif
    g_last = call;
  }
  return g_gemm.run(stream) == cutlass::Status::kSuccess ? 0 : 4;
}

struct GemmrlCutlassPlan {
  int M, N, K, lda, ldb, ldd;
  void* workspace;
  size_t workspace_bytes;
  int swizzle, raster, decomposition, splits;
};

void* gemmrl_cutlass_plan(int M, int N, int K, int lda, int ldb, int ldd, void* workspace, size_t workspace_bytes,
                          int swizzle, int raster, int decomposition, int splits) {
  return new (std::nothrow)
      GemmrlCutlassPlan{M, N, K, lda, ldb, ldd, workspace, workspace_bytes, swizzle, raster, decomposition, splits};
}

int gemmrl_cutlass_plan_run(void* plan, const void* A, const void* B, void* D, cudaStream_t stream) {
  const GemmrlCutlassPlan* p = static_cast<const GemmrlCutlassPlan*>(plan);
  if (p == nullptr) return 5;
  return gemmrl_cutlass_gemm(A, B, D, p->M, p->N, p->K, p->lda, p->ldb, p->ldd, p->workspace, p->workspace_bytes,
                             stream, p->swizzle, p->raster, p->decomposition, p->splits);
}

void gemmrl_cutlass_plan_free(void* plan) { delete static_cast<GemmrlCutlassPlan*>(plan); }

}  // extern "C"
