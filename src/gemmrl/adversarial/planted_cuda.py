"""Planted CUDA C++ candidates in the gemmrl ABI: one correct naive GEMM and faults a search over untrusted code
must survive. Each is a :class:`~gemmrl.kernels.cuda_source.CudaSource` made from one source with ``-D`` flags:

  ``correct``          naive fp32-accumulating GEMM on the stream it is given (any shape, both layouts)
  ``illegal_address``  stores through a wild pointer: an illegal-address fault that poisons the CUDA context
  ``hang``             a kernel that never finishes (spins on a value the host never changes)
  ``legacy_stream``    the correct kernel launched on the legacy default stream (breaks graphs, other streams)
  ``huge_malloc``      asks cudaMalloc for more than the device's memory in its call path (returns the error)
  ``device_sync``      the correct kernel, then cudaDeviceSynchronize in the call path
  ``cpp_thread``       returns at once; a detached std::thread launches the correct kernel 20 ms later (the
                       timer and the battery's read of C right after the call see no work)
  ``syntax_error``     does not compile (a structured compile error with file and line)
  ``spills``           compiles with -maxrregcount=24 so ptxas spills (rejected by the spill limit)

Tests: tests/kernels/test_cuda_source.py (compile-only CPU tier) and tests/test_sandbox_gpu.py (the sandbox pool
survives every fault and finishes the rest of its work).
"""

from __future__ import annotations

from ..kernels.cuda_source import CudaSource, ShapeRange

SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#ifdef PLANT_CPP_THREAD
#include <chrono>
#include <thread>
#endif

#ifdef GEMMRL_BF16
typedef __nv_bfloat16 T;
__device__ __forceinline__ float to_f(T x) { return __bfloat162float(x); }
__device__ __forceinline__ T from_f(float x) { return __float2bfloat16(x); }
#else
typedef __half T;
__device__ __forceinline__ float to_f(T x) { return __half2float(x); }
__device__ __forceinline__ T from_f(float x) { return __float2half(x); }
#endif

__global__ void planted_gemm(const T* A, const T* B, T* C, int M, int N, int K, int lda, int ldb, int ldc,
                             int b_row, volatile int* never) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  int m = blockIdx.y * blockDim.y + threadIdx.y;
#ifdef PLANT_HANG
  while (never == nullptr || *never == 0) { __nanosleep(1000); }
#endif
  if (m >= M || n >= N) return;
  float acc = 0.f;
#ifdef PLANT_SPILLS
  float part[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) part[i] = 0.f;
  for (int k = 0; k < K; ++k) {
    float p = to_f(A[(size_t)m * lda + k]) * to_f(b_row ? B[(size_t)k * ldb + n] : B[(size_t)n * ldb + k]);
#pragma unroll
    for (int i = 0; i < 48; ++i) part[i] += p * (float)(i + 1) * (float)(k % (i + 2));
  }
#pragma unroll
  for (int i = 0; i < 48; ++i) acc += part[i] * 1e-30f;
#endif
  for (int k = 0; k < K; ++k)
    acc += to_f(A[(size_t)m * lda + k]) * to_f(b_row ? B[(size_t)k * ldb + n] : B[(size_t)n * ldb + k]);
#ifdef PLANT_ILLEGAL
  C = (T*)(0x10) + (size_t)m * 4096 * 4096;
#endif
  C[(size_t)m * ldc + n] = from_f(acc);
}

extern "C" int gemmrl_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
#ifdef PLANT_HUGE_MALLOC
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, total_b * 2);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "planted huge_malloc: cudaMalloc(%zu) failed: %s\n", total_b * 2, cudaGetErrorString(e));
    return (int)e;
  }
  cudaFree(p);
#endif
#ifdef PLANT_LEGACY
  stream = 0;
#endif
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
#ifdef PLANT_CPP_THREAD
  std::thread([=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    planted_gemm<<<grid, block, 0, stream>>>((const T*)A, (const T*)B, (T*)C, M, N, K, lda, ldb, ldc,
                                             GEMMRL_B_ROW, (volatile int*)workspace);
  }).detach();
  return 0;
#endif
  planted_gemm<<<grid, block, 0, stream>>>((const T*)A, (const T*)B, (T*)C, M, N, K, lda, ldb, ldc,
                                           GEMMRL_B_ROW, (volatile int*)workspace);
#ifdef PLANT_DEVICE_SYNC
  cudaDeviceSynchronize();
#endif
  return (int)cudaGetLastError();
}
"""

_FLAGS = {
    "correct": (),
    "illegal_address": ("-DPLANT_ILLEGAL",),
    "hang": ("-DPLANT_HANG",),
    "legacy_stream": ("-DPLANT_LEGACY",),
    "huge_malloc": ("-DPLANT_HUGE_MALLOC",),
    "device_sync": ("-DPLANT_DEVICE_SYNC",),
    "cpp_thread": ("-DPLANT_CPP_THREAD",),
    "spills": ("-DPLANT_SPILLS", "-maxrregcount=24"),
}
PLANTED = tuple(_FLAGS) + ("syntax_error",)
# what each must come to when evaluated in the sandbox (failure class, as evaluate/sandbox report it)
EXPECTED = {"correct": "ok", "illegal_address": "cuda_fault", "hang": "timeout", "legacy_stream": "rejected",
            "huge_malloc": "oom", "device_sync": "rejected", "cpp_thread": "rejected", "syntax_error": "build", "spills": "build"}


def planted_source(kind: str, layout: str = "tn", dtype: str = "fp16") -> CudaSource:
    """The planted candidate ``kind`` (one of ``PLANTED``) as a CudaSource declaring every shape."""
    if kind not in PLANTED:
        raise ValueError(f"unknown planted CUDA candidate {kind!r}; one of {', '.join(PLANTED)}")
    code = SOURCE if kind != "syntax_error" else SOURCE.replace("if (m >= M || n >= N) return;", "if (m >= M || n >= N) return  // missing ;", 1)
    flags = _FLAGS.get(kind, ()) + (f"-DGEMMRL_B_ROW={int(layout == 'nn')}",) + (("-DGEMMRL_BF16",) if dtype == "bf16" else ())
    return CudaSource(code=code, entry="gemmrl_gemm", layout=layout, dtype=dtype, shapes=ShapeRange(),
                      name=f"cuda:planted-{kind}", flags=flags)
