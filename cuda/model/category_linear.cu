// Segment GEMMs for the per-embodiment linear (contract: category_linear.cuh).
//
// One 64 x 64 output tile per block of 4 warps (2 x 2, 32 x 32 each) on bf16
// WMMA fragments with fp32 accumulators; 32-deep K steps staged through shared
// memory, the next step's global loads issued before the current step's MMAs.
// The "rows" kernel serves the forward (B operand W[e]) and grad_input (B
// operand W[e]^T): its tiles never straddle two slots (the plan counts tiles
// per slot). The grad_weight kernel reduces over a slot's rows.
#include "category_linear.cuh"

#include <mma.h>

#include <cstdio>

namespace loongforge::kernels {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128;
constexpr int kLdA = kBK + 8;                     // A tile, row-major [kBM][kLdA]
constexpr int kLdAT = kBM + 8;                    // A tile, column-major: stored [kBK][kLdAT]
constexpr int kLdB = kBN + 8;                     // B tile, row-major [kBK][kLdB]
constexpr int kLdC = kBN + 4;                     // fp32 result tile [kBM][kLdC]
constexpr int kPerThread = kBM * kBK / kThreads;  // 16 (A and B tiles are both 2048 elements)
static_assert(kBM * kBK == kBK * kBN, "A and B tiles hold the same number of elements");

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

struct Plan {
  const int* order;  // [B] sample indices sorted by slot (stable)
  const int* seg;    // [E + 1] first sorted sample of each slot
  const int* tiles;  // [E + 1] first row tile of each slot (kBM rows of T tokens)
  __device__ Plan(const int* p, int B, int E) : order(p), seg(p + B), tiles(p + B + E + 1) {}
};

// The global token row (sample * T + t) of row r of a slot's rows, -1 past them (first: the
// slot's first sorted sample; rows: its token rows).
__device__ __forceinline__ int token_row(const Plan& plan, int first, int rows, int r, int T) {
  return r < rows ? plan.order[first + r / T] * T + r % T : -1;
}

__global__ void plan_kernel(const int64_t* ids, int B, int E, int T, int* out) {
  extern __shared__ int count[];  // [E]
  int* order = out;
  int* seg = out + B;
  int* tiles = out + B + E + 1;
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int b = threadIdx.x; b < B; b += blockDim.x) {
    const int64_t id = ids[b];
    if (id < 0 || id >= E) {
      printf("loongforge category_linear: ids[%d] = %lld is outside [0, %d) (the model's num_embodiments)\n", b,
             static_cast<long long>(id), E);
      __trap();
    }
    atomicAdd(&count[id], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // B and E are small (a micro-batch, the embodiment slots): one thread scans
    int s = 0, t = 0;
    for (int e = 0; e < E; ++e) {
      seg[e] = s;
      tiles[e] = t;
      t += (count[e] * T + kBM - 1) / kBM;
      const int c = count[e];
      count[e] = s;  // becomes the slot's write cursor
      s += c;
    }
    seg[E] = s;
    tiles[E] = t;
    for (int b = 0; b < B; ++b) order[count[ids[b]]++] = b;
  }
}

using namespace nvcuda;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// 2 x 2 fragments of one warp's 32 x 32 quarter of the tile, over one kBK step.
template <typename FA>
__device__ __forceinline__ void mma_step(const __nv_bfloat16* sA, int a_row_stride, int a_k_stride,
                                         const __nv_bfloat16* sB, FragC (&acc)[2][2]) {
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    FA a[2];
    FragB b[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int m = wm * 32 + i * 16;
      const int lda = a_row_stride == 1 ? a_k_stride : a_row_stride;
      wmma::load_matrix_sync(a[i], sA + m * a_row_stride + kk * a_k_stride, lda);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], sB + kk * kLdB + wn * 32 + j * 16, kLdB);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
  }
}

__device__ __forceinline__ void store_acc(float* sC, FragC (&acc)[2][2]) {
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(sC + (wm * 32 + i * 16) * kLdC + wn * 32 + j * 16, acc[i][j], kLdC, wmma::mem_row_major);
}

__device__ __forceinline__ void zero_acc(FragC (&acc)[2][2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
}

// out[r, n] = sum_k A[r, k] * Bop_e(k, n) (+ bias[e, n]) for the rows r of one slot e.
// kTransposed = false: Bop_e(k, n) = W[e][k][n] (forward, Kp = K, Np = N);
// kTransposed = true: Bop_e(k, n) = W[e][n][k] (grad_input, Kp = N, Np = K).
template <typename AT, typename WT, typename OT, bool kTransposed>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const AT* a, const WT* weight, const WT* bias, const int* plan_ints, int B, int E, int T, int Kp,
                int Np, OT* out) {
  __shared__ __align__(128) __nv_bfloat16 sA[kBM * kLdA];
  __shared__ __align__(128) __nv_bfloat16 sB[kBK * kLdB];
  __shared__ __align__(128) float sC[kBM * kLdC];
  __shared__ int row_of[kBM];  // global token row of each tile row, -1 past the slot's rows
  __shared__ int slot;

  const Plan plan(plan_ints, B, E);
  const int tile = blockIdx.x;
  if (threadIdx.x == 0) {
    int lo = 0, hi = E;  // the slot e with tiles[e] <= tile < tiles[e + 1] (-1: no such tile)
    if (tile >= plan.tiles[E]) {
      lo = -1;
    } else {
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (plan.tiles[mid] <= tile)
          lo = mid;
        else
          hi = mid;
      }
    }
    slot = lo;
  }
  __syncthreads();
  const int e = slot;
  if (e < 0) return;
  const int first = plan.seg[e], rows = (plan.seg[e + 1] - first) * T;
  const int r0 = (tile - plan.tiles[e]) * kBM, n0 = blockIdx.y * kBN;
  for (int m = threadIdx.x; m < kBM; m += kThreads) {
    row_of[m] = token_row(plan, first, rows, r0 + m, T);
  }
  __syncthreads();
  const WT* w = weight + static_cast<int64_t>(e) * Kp * Np;

  float ra[kPerThread], rb[kPerThread];
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int m = idx / kBK, k = k0 + idx % kBK;  // consecutive threads: consecutive k of one row
      ra[i] = (row_of[m] >= 0 && k < Kp) ? to_float(a[static_cast<int64_t>(row_of[m]) * Kp + k]) : 0.f;
      if (kTransposed) {  // W[e][n][k]: consecutive k
        const int n = n0 + idx / kBK, kb = k0 + idx % kBK;
        rb[i] = (n < Np && kb < Kp) ? to_float(w[static_cast<int64_t>(n) * Kp + kb]) : 0.f;
      } else {  // W[e][k][n]: consecutive n
        const int kb = k0 + idx / kBN, n = n0 + idx % kBN;
        rb[i] = (n < Np && kb < Kp) ? to_float(w[static_cast<int64_t>(kb) * Np + n]) : 0.f;
      }
    }
  };
  FragC acc[2][2];
  zero_acc(acc);
  load(0);
  for (int k0 = 0; k0 < Kp; k0 += kBK) {
    __syncthreads();  // the previous step's MMAs are done with sA / sB
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      sA[(idx / kBK) * kLdA + idx % kBK] = __float2bfloat16(ra[i]);
      if (kTransposed)
        sB[(idx % kBK) * kLdB + idx / kBK] = __float2bfloat16(rb[i]);
      else
        sB[(idx / kBN) * kLdB + idx % kBN] = __float2bfloat16(rb[i]);
    }
    __syncthreads();
    if (k0 + kBK < Kp) load(k0 + kBK);  // in flight during the MMAs
    mma_step<FragA>(sA, kLdA, 1, sB, acc);
  }
  store_acc(sC, acc);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kBM * kBN; idx += kThreads) {
    const int m = idx / kBN, n = n0 + idx % kBN;
    if (row_of[m] < 0 || n >= Np) continue;
    float v = sC[m * kLdC + idx % kBN];
    if (bias != nullptr) v += to_float(bias[static_cast<int64_t>(e) * Np + n]);
    out[static_cast<int64_t>(row_of[m]) * Np + n] = from_float<OT>(v);
  }
}

// dW[e][i][j] = sum over slot e's rows r of x[r][i] * dy[r][j]; dbias[e][j] = sum of dy[r][j]
// (blocks of the first i tile). Grid: (E, i tiles x j tiles).
template <typename WT>
__global__ void __launch_bounds__(kThreads)
    grad_weight_kernel(const __nv_bfloat16* x, const WT* dy, const int* plan_ints, int B, int E, int T, int K, int N,
                       WT* dweight, WT* dbias) {
  __shared__ __align__(128) __nv_bfloat16 sAT[kBK * kLdAT];
  __shared__ __align__(128) __nv_bfloat16 sB[kBK * kLdB];
  __shared__ __align__(128) float sC[kBM * kLdC];
  __shared__ int row_of[2][kBK];  // the global token rows of the current and the next K step

  const Plan plan(plan_ints, B, E);
  const int e = blockIdx.x;
  const int tiles_n = (N + kBN - 1) / kBN;
  const int i0 = (blockIdx.y / tiles_n) * kBM, j0 = (blockIdx.y % tiles_n) * kBN;
  const int first = plan.seg[e], rows = (plan.seg[e + 1] - first) * T;

  auto rows_at = [&](int r0, int buf) {
    for (int k = threadIdx.x; k < kBK; k += kThreads) row_of[buf][k] = token_row(plan, first, rows, r0 + k, T);
  };
  float ra[kPerThread], rb[kPerThread];
  auto load = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      const int k = idx / kBM, m = i0 + idx % kBM;  // consecutive threads: consecutive features of one row
      const int row = row_of[buf][k];
      ra[i] = (row >= 0 && m < K) ? to_float(x[static_cast<int64_t>(row) * K + m]) : 0.f;
      const int kb = idx / kBN, n = j0 + idx % kBN;
      const int rowb = row_of[buf][kb];
      rb[i] = (rowb >= 0 && n < N) ? to_float(dy[static_cast<int64_t>(rowb) * N + n]) : 0.f;
    }
  };
  FragC acc[2][2];
  zero_acc(acc);
  if (rows > 0) {
    rows_at(0, 0);
    __syncthreads();
    load(0);
    int buf = 0;
    for (int r0 = 0; r0 < rows; r0 += kBK, buf ^= 1) {
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int idx = threadIdx.x + i * kThreads;
        sAT[(idx / kBM) * kLdAT + idx % kBM] = __float2bfloat16(ra[i]);
        sB[(idx / kBN) * kLdB + idx % kBN] = __float2bfloat16(rb[i]);
      }
      if (r0 + kBK < rows) rows_at(r0 + kBK, buf ^ 1);
      __syncthreads();
      if (r0 + kBK < rows) load(buf ^ 1);
      mma_step<FragAT>(sAT, 1, kLdAT, sB, acc);
    }
  }
  store_acc(sC, acc);
  __syncthreads();
  WT* dw = dweight + static_cast<int64_t>(e) * K * N;
  for (int idx = threadIdx.x; idx < kBM * kBN; idx += kThreads) {
    const int m = i0 + idx / kBN, n = j0 + idx % kBN;
    if (m < K && n < N) dw[static_cast<int64_t>(m) * N + n] = from_float<WT>(sC[(idx / kBN) * kLdC + idx % kBN]);
  }
  if (i0 == 0) {
    for (int c = threadIdx.x; c < kBN; c += kThreads) {
      const int n = j0 + c;
      if (n >= N) continue;
      float s = 0.f;
      for (int r = 0; r < rows; ++r)
        s += to_float(dy[static_cast<int64_t>(token_row(plan, first, rows, r, T)) * N + n]);
      dbias[static_cast<int64_t>(e) * N + n] = from_float<WT>(s);
    }
  }
}

int row_tiles_bound(int B, int E, int T) {  // sum over slots of ceil(rows_e / kBM)
  const int used = B < E ? B : E;
  return (B * T + kBM - 1) / kBM + used;
}

}  // namespace

int64_t category_plan_ints(int64_t B, int64_t E) {
  return B + 2 * (E + 1);
}

cudaError_t category_linear_plan(const int64_t* ids, int B, int E, int T, int* plan, cudaStream_t stream) {
  plan_kernel<<<1, 256, E * sizeof(int), stream>>>(ids, B, E, T, plan);
  return cudaGetLastError();
}

template <typename WT>
cudaError_t category_linear_forward(const __nv_bfloat16* x, const WT* weight, const WT* bias, const int* plan, int B,
                                    int E, int T, int K, int N, WT* y, cudaStream_t stream) {
  const dim3 grid(row_tiles_bound(B, E, T), (N + kBN - 1) / kBN);
  rows_kernel<__nv_bfloat16, WT, WT, false><<<grid, kThreads, 0, stream>>>(x, weight, bias, plan, B, E, T, K, N, y);
  return cudaGetLastError();
}

template <typename WT>
cudaError_t category_linear_grad_input(const WT* dy, const WT* weight, const int* plan, int B, int E, int T, int K,
                                       int N, __nv_bfloat16* dx, cudaStream_t stream) {
  const dim3 grid(row_tiles_bound(B, E, T), (K + kBN - 1) / kBN);
  rows_kernel<WT, WT, __nv_bfloat16, true><<<grid, kThreads, 0, stream>>>(dy, weight, nullptr, plan, B, E, T, N, K, dx);
  return cudaGetLastError();
}

template <typename WT>
cudaError_t category_linear_grad_weight(const __nv_bfloat16* x, const WT* dy, const int* plan, int B, int E, int T,
                                        int K, int N, WT* dweight, WT* dbias, cudaStream_t stream) {
  const dim3 grid(E, ((K + kBM - 1) / kBM) * ((N + kBN - 1) / kBN));
  grad_weight_kernel<WT><<<grid, kThreads, 0, stream>>>(x, dy, plan, B, E, T, K, N, dweight, dbias);
  return cudaGetLastError();
}

#define LOONGFORGE_CATEGORY_LINEAR(WT)                                                                               \
  template cudaError_t category_linear_forward<WT>(const __nv_bfloat16*, const WT*, const WT*, const int*, int, int, \
                                                   int, int, int, WT*, cudaStream_t);                                \
  template cudaError_t category_linear_grad_input<WT>(const WT*, const WT*, const int*, int, int, int, int, int,     \
                                                      __nv_bfloat16*, cudaStream_t);                                 \
  template cudaError_t category_linear_grad_weight<WT>(const __nv_bfloat16*, const WT*, const int*, int, int, int,   \
                                                       int, int, WT*, WT*, cudaStream_t);
LOONGFORGE_CATEGORY_LINEAR(float)
LOONGFORGE_CATEGORY_LINEAR(__nv_bfloat16)
#undef LOONGFORGE_CATEGORY_LINEAR

}  // namespace loongforge::kernels
