// Train mode's BatchNorm side of the backward in one kernel (sm_90+): fj_bwd_reduce,
// fj_bwd_coef and fj_bwd_da (kernels/bn_backward.cuh) as one pass over dy and saved.
//
// Why: those three read dy and saved twice (once for the column sums, once to form da), and the
// second read comes from DRAM whenever the two tensors exceed L2: at 4096^3 bf16 (H200, ncu)
// the reduce took 21 us, the coefficients 4 and da 24, at the memory's rate, 128 of their 160
// MB being the two reads. A column's sums need all of the run's rows, so one CTA cannot hold
// them; a cluster can: its CTAs split the rows of a slab of columns, each keeps its rows of dy
// and saved in shared memory, the CTAs' column sums meet through distributed shared memory
// (no grid barrier, no workspace), and each CTA forms da from what it holds. dy and saved are
// read once; da is written once.
//
// Grid: (cluster, column slabs), clusters of `cluster` CTAs along x (a launch attribute: the
// host picks it per run from the rows, common/backward_shape.h, cluster_bn_launch). The sums
// are added in a fixed order (a thread's rows, then the row threads, then the CTAs by rank),
// so the gradients are the same on every run, though not bit-identical to the three passes'
// (they add in another order).
#pragma once
#include "common/backward_params.h"
#include "common/backward_shape.h"
#include "common/cp_async.cuh"
#include "common/grid_dependency.cuh"
#include "kernels/bn_backward.cuh"

namespace fj {

template <class Spec>
struct ClusterBnShape {
  using T = typename Spec::T;
  // A thread's piece of a row: kClusterBnVecBytes where the rows' alignment allows.
  static constexpr int kVecBytes =
      Spec::VEC_BYTES < kClusterBnVecBytes ? Spec::VEC_BYTES : kClusterBnVecBytes;
  static constexpr int VEC = kVecBytes / static_cast<int>(sizeof(T)) > 0
                                 ? kVecBytes / static_cast<int>(sizeof(T))
                                 : 1;
  static constexpr int kBytes = VEC * static_cast<int>(sizeof(T));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  static constexpr int kCols = kClusterBnColThreads * VEC;  // columns of a slab
  static constexpr int kSlabs = (Spec::N + kCols - 1) / kCols;
  static_assert(cluster_bn_row_bytes(VEC * static_cast<int>(sizeof(T))) ==
                    kClusterBnColThreads * kBytes,
                "the host sizes shared memory with the same row");
};

namespace cluster_bn {

__device__ __forceinline__ unsigned cta_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cta_count() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster arrives; release: this CTA's shared-memory writes
// before it are visible to the others after their wait.
__device__ __forceinline__ void arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The float2 at this CTA's shared address `addr` in CTA `rank` of the cluster.
__device__ __forceinline__ float2 load_remote(unsigned addr, unsigned rank) {
  float2 v;
  asm volatile(
      "{ .reg .b32 r; mapa.shared::cluster.u32 r, %2, %3;\n"
      "ld.shared::cluster.v2.f32 {%0, %1}, [r]; }\n"
      : "=f"(v.x), "=f"(v.y)
      : "r"(addr), "r"(rank));
  return v;
}

}  // namespace cluster_bn

template <class Spec>
__device__ void bn_backward_cluster(const BackwardParams& p) {
  static_assert(Spec::TRAIN, "eval's fj_bwd_reduce already forms da in its one pass");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = typename Spec::T;
  using S = ClusterBnShape<Spec>;
  constexpr int VEC = S::VEC;
  constexpr int kRowThreads = kClusterBnRowThreads;
  extern __shared__ __align__(16) unsigned char fj_cluster_bn_smem[];
  constexpr int kWarps = kClusterBnThreads / 32;
  static_assert(kRowThreads % 4 == 0 && 32 % kClusterBnColThreads == 0, "a warp spans whole rows");
  __shared__ float2 warp_sums[kWarps][S::kCols];
  __shared__ float2 cta_sums[S::kCols];
  __shared__ float4 coef[S::kCols];

  join_launch_chain();
  const unsigned rank = cluster_bn::cta_rank(), ranks = cluster_bn::cta_count();
  const int tx = static_cast<int>(threadIdx.x) % kClusterBnColThreads;
  const int ty = static_cast<int>(threadIdx.x) / kClusterBnColThreads;
  const int slab_c0 = static_cast<int>(blockIdx.y) * S::kCols;
  const int c = slab_c0 + tx * VEC;
  const int n_here = max(0, min(VEC, Spec::N - c));
  const int row0 = static_cast<int>(rank) * p.cluster_rows;
  const int rows = max(0, min(p.cluster_rows, p.m - row0));  // this CTA's

  // 1. Every row this thread owns (ty, ty + kRowThreads, ...) of dy and saved, copied into
  // shared memory at once, in kGroups groups: the whole CTA's share is in flight together (a
  // streaming pass needs bytes in flight more than anything), and the sums start on the first
  // group while the others arrive. Columns past N are zero-filled (they add nothing to sums).
  unsigned char* const dy_s = fj_cluster_bn_smem;
  unsigned char* const sv_s = fj_cluster_bn_smem + static_cast<size_t>(p.cluster_rows) *
                                                       kClusterBnColThreads * S::kBytes;
  auto at = [&](unsigned char* base, int r) {
    return base + (static_cast<size_t>(r) * kClusterBnColThreads + tx) * S::kBytes;
  };
  const int src_bytes = n_here * static_cast<int>(sizeof(T));
  const T* const dy_g = static_cast<const T*>(p.dy);
  const T* const sv_g = static_cast<const T*>(p.saved);
  constexpr int kGroups = 4;
  const int steps = rows > ty ? (rows - ty + kRowThreads - 1) / kRowThreads : 0;
  const int per_group = (steps + kGroups - 1) / kGroups;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    for (int k = g * per_group; k < min(steps, (g + 1) * per_group); ++k) {
      const int r = ty + k * kRowThreads;
      const long long off = static_cast<long long>(row0 + r) * Spec::LDY + (n_here ? c : 0);
      cp_async<S::kBytes>(smem_u32(at(dy_s, r)), dy_g + off, src_bytes);
      cp_async<S::kBytes>(smem_u32(at(sv_s, r)), sv_g + off, src_bytes);
    }
    cp_async_commit();
  }

  // 2. The CTA's column sums {sum dy, sum dy c}: a thread's rows in order (each group once its
  // copies have landed: they are this thread's own, so no block barrier), then the warp's four
  // row threads by shuffles, then the warps in order.
  float sdy[VEC], sdyc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) sdy[j] = sdyc[j] = 0.f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (g == 0) cp_async_wait<kGroups - 1>();
    if (g == 1) cp_async_wait<kGroups - 2>();
    if (g == 2) cp_async_wait<kGroups - 3>();
    if (g == 3) cp_async_wait<0>();
    for (int k = g * per_group; k < min(steps, (g + 1) * per_group); ++k) {
      const int r = ty + k * kRowThreads;
      Packed<T, VEC> dy, sv;
      dy.load(reinterpret_cast<const T*>(at(dy_s, r)));
      sv.load(reinterpret_cast<const T*>(at(sv_s, r)));
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        sdy[j] += dy.get(j);
        sdyc[j] = __fmaf_rn(dy.get(j), sv.get(j), sdyc[j]);
      }
    }
  }
  static_assert(kGroups == 4, "the waits above name each group");
  // Lanes that differ by a multiple of kClusterBnColThreads hold the same columns of other rows.
#pragma unroll
  for (int j = 0; j < VEC; ++j)
#pragma unroll
    for (int m = kClusterBnColThreads; m < 32; m *= 2) {
      sdy[j] += __shfl_xor_sync(0xffffffffu, sdy[j], m);
      sdyc[j] += __shfl_xor_sync(0xffffffffu, sdyc[j], m);
    }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (static_cast<int>(threadIdx.x) % 32 < kClusterBnColThreads)
#pragma unroll
    for (int j = 0; j < VEC; ++j) warp_sums[warp][tx * VEC + j] = make_float2(sdy[j], sdyc[j]);
  __syncthreads();
  if (threadIdx.x < S::kCols) {
    float2 t = warp_sums[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      t.x += warp_sums[w][threadIdx.x].x;
      t.y += warp_sums[w][threadIdx.x].y;
    }
    cta_sums[threadIdx.x] = t;
  }

  // 3. The cluster's sums: every CTA adds the CTAs' sums by rank (the same order in each, so
  // each gets the same totals; every remote load in flight first), and computes the column's da
  // coefficients; rank 0 stores the parameter gradients.
  cluster_bn::arrive();
  cluster_bn::wait();
  if (threadIdx.x < S::kCols) {
    const int n = slab_c0 + static_cast<int>(threadIdx.x);
    const unsigned addr = smem_u32(&cta_sums[threadIdx.x]);
    float2 v[kClusterBnMaxCluster];
#pragma unroll
    for (unsigned q = 0; q < kClusterBnMaxCluster; ++q)
      v[q] = q < ranks ? cluster_bn::load_remote(addr, q) : make_float2(0.f, 0.f);
    float2 t = v[0];
#pragma unroll
    for (int q = 1; q < kClusterBnMaxCluster; ++q) {
      t.x += v[q].x;
      t.y += v[q].y;
    }
    coef[threadIdx.x] = n < Spec::N ? train_column_gradients<Spec>(p, n, t, rank == 0)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // Done reading the other CTAs' shared memory: they may exit once every CTA has said so (the
  // wait at the end). Arrive now, wait last, so that forming da overlaps the others' reads.
  cluster_bn::arrive();
  __syncthreads();

  // 4. da from the rows this thread copied (kernels/bn_backward.cuh, backward_da).
  if (p.ws_da && n_here > 0) {
    float4 k[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) k[j] = coef[tx * VEC + j];
    for (int r = ty; r < rows; r += kRowThreads) {
      Packed<T, VEC> dy, sv;
      dy.load(reinterpret_cast<const T*>(at(dy_s, r)));
      sv.load(reinterpret_cast<const T*>(at(sv_s, r)));
      float da[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) da[j] = backward_da(k[j], dy.get(j), sv.get(j));
      store_da<Spec, VEC>(p, row0 + r, c, n_here, da);
    }
  }
  cluster_bn::wait();
#else
  __trap();  // the host launches it on sm_90+ only (clusters)
#endif
}

}  // namespace fj
