// Kernels for benchmarks/acceptance/cold_anatomy.py: where a tiny call's time goes in the cold protocol (one call after the
// L2 is overwritten with dirty lines). Each entry launches one kernel on `stream`; none allocates or syncs.
//
//   cold_empty        1 CTA of 32 threads that does nothing: the launch and the events' own cost
//   cold_load1        thread 0 loads 16 B from x and stores them to y: one DRAM round trip for data
//   cold_chain        thread 0 follows `hops` dependent loads through x (a pointer chain 4 KiB apart, set up by
//                     cold_chain_init): `hops` DRAM round trips in a row, the latency per trip
//   cold_tile         one CTA of 128 threads loads `bytes` of x (16 B a thread per pass, all passes issued before
//                     any use) and stores their xor to y: the operand fetch of a one-CTA GEMM
//   cold_codeN        one CTA of 128 threads runs N unrolled FFMAs in 8 independent chains (about 16 B of SASS each,
//                     straight-line): after the flush the instructions come from DRAM, so cold minus warm over N
//                     is the price of code size
#include <cuda_runtime.h>
#include <cstdint>

__global__ void k_empty() {}

__global__ void k_load1(const int4* __restrict__ x, int4* __restrict__ y) {
  if (threadIdx.x == 0) y[0] = x[0];
}

__global__ void k_chain_init(uint64_t* x, int hops, int stride_words) {
  for (int i = threadIdx.x; i < hops; i += blockDim.x)
    x[(size_t)i * stride_words] = (uint64_t)(x + (size_t)(i + 1) * stride_words);
}

__global__ void k_chain(const uint64_t* x, int hops, uint64_t* y) {
  if (threadIdx.x != 0) return;
  const uint64_t* p = x;
  for (int i = 0; i < hops; ++i) p = (const uint64_t*)(*(volatile const uint64_t*)p);
  y[0] = (uint64_t)p;
}

__global__ void k_tile(const int4* __restrict__ x, int n16, int4* __restrict__ y) {
  int4 acc = make_int4(0, 0, 0, 0);
  constexpr int kMax = 16;  // up to 16 loads in flight per thread (32 KiB with 128 threads)
  int4 v[kMax];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    int i = threadIdx.x + j * blockDim.x;
    v[j] = i < n16 ? x[i] : make_int4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < kMax; ++j) { acc.x ^= v[j].x; acc.y ^= v[j].y; acc.z ^= v[j].z; acc.w ^= v[j].w; }
  y[threadIdx.x] = acc;
}

template <int N>
__global__ void k_code(float seed, float* __restrict__ y) {
  float a[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) a[c] = seed + c;
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
#pragma unroll
    for (int c = 0; c < 8; ++c) a[c] = fmaf(a[c], 1.0001f, (float)(i * 8 + c));
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += a[c];
  y[threadIdx.x] = s;
}

extern "C" {
int cold_empty(cudaStream_t s) { k_empty<<<1, 32, 0, s>>>(); return (int)cudaGetLastError(); }
int cold_load1(const void* x, void* y, cudaStream_t s) {
  k_load1<<<1, 32, 0, s>>>((const int4*)x, (int4*)y); return (int)cudaGetLastError();
}
int cold_chain_init(void* x, int hops, int stride_words, cudaStream_t s) {
  k_chain_init<<<1, 256, 0, s>>>((uint64_t*)x, hops, stride_words); return (int)cudaGetLastError();
}
int cold_chain(const void* x, int hops, void* y, cudaStream_t s) {
  k_chain<<<1, 32, 0, s>>>((const uint64_t*)x, hops, (uint64_t*)y); return (int)cudaGetLastError();
}
int cold_tile(const void* x, int bytes, void* y, cudaStream_t s) {
  k_tile<<<1, 128, 0, s>>>((const int4*)x, bytes / 16, (int4*)y); return (int)cudaGetLastError();
}
#define CODE_ENTRY(N) \
  int cold_code##N(float seed, void* y, cudaStream_t s) { \
    k_code<N><<<1, 128, 0, s>>>(seed, (float*)y); return (int)cudaGetLastError(); }
CODE_ENTRY(64)
CODE_ENTRY(512)
CODE_ENTRY(2048)
CODE_ENTRY(8192)
CODE_ENTRY(32768)
}
