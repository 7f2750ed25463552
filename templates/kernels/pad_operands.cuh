// fj_pad_operands (KernelConfig::pad_operands): TMA loads a tile only from rows whose start and
// stride are multiples of 16 bytes, so x and W rows that are not (odd K in 16-bit types, K % 4
// in fp32, odd ldx/ldw, a tensor sliced at an odd column) would keep the warpspec GEMM off
// wgmma altogether. This kernel copies them into Params::ws_padded first: W's N rows, then the
// run's m rows of x, each Spec::KP elements long (K rounded up to 128 bytes), and the GEMM's
// tensor maps point there. One pass over x and W: with it the whole op ran 1.6-3.1x faster than
// on the tiled kernel at 777x1536x2050, 1000x1001x1003 and 4097x4095x129 bf16 (H100,
// docs/performance.md); the copy itself was not timed apart.
//
// Each thread writes one 16-byte unit of a padded row, reading its elements with the widest
// loads the caller's alignment allows (Spec::VEC_BYTES); consecutive threads take consecutive
// units, so a warp reads and writes 512 contiguous bytes of a row. Elements past K in a row's
// last unit are written as zeros (the tensor maps stop at K, so nothing reads them; zeros keep
// the workspace's contents a function of the inputs). Host launch contract: block.x =
// kPadThreads, any grid.x (a grid-stride loop; the host sizes it to the work, at most a few
// waves).
#pragma once
#include "common/limits.h"
#include "common/params.h"
#include "common/rows.cuh"
#include "common/select.cuh"
#include "common/types.cuh"

namespace fj {

namespace detail {

// 16 bytes as the load widths the copy uses.
union PadUnit {
  uint4 v;
  uint2 d[2];
  unsigned w[4];
  unsigned short h[8];
};

// Elements at..at + BYTES / sizeof(Raw) - 1 of the unit from one BYTES-wide aligned load at
// `src`. Never 16: a padded problem's rows are less aligned than that.
template <int BYTES, class Raw>
__device__ __forceinline__ void pad_load(PadUnit& u, int at, const Raw* src) {
  static_assert(BYTES == 8 || BYTES == 4 || BYTES == 2, "pad_load: 2, 4 or 8 bytes");
  if constexpr (BYTES == 8)
    u.d[at * sizeof(Raw) / 8] = *reinterpret_cast<const uint2*>(src);
  else if constexpr (BYTES == 4)
    u.w[at * sizeof(Raw) / 4] = *reinterpret_cast<const unsigned*>(src);
  else
    u.h[at] = *reinterpret_cast<const unsigned short*>(src);
}

}  // namespace detail

template <class Spec>
__device__ void pad_operands(const Params& p) {
  using T = typename Spec::T;
  // Raw bits of one element: the copy never does arithmetic on them.
  using Raw = typename Select<sizeof(T) == 2, unsigned short, unsigned>::type;
  constexpr int kElem = static_cast<int>(sizeof(T));
  constexpr int kVec = 16 / kElem;  // elements per unit written
  constexpr int kLoadBytes = Spec::VEC_BYTES;
  static_assert(kLoadBytes >= kElem && kLoadBytes < 16,
                "pad_operands: rows aligned to at least one element and less than 16 bytes");
  constexpr int kLoad = kLoadBytes / kElem;            // elements per load
  constexpr int kUnits = (Spec::K + kVec - 1) / kVec;  // units a row needs (the rest: never read)
  static_assert(Spec::KP % kVec == 0 && Spec::KP >= kUnits * kVec,
                "pad_operands: KP must hold whole 16-byte units past K");
  const int m = rows_of<Spec>(p);
  const long long total = static_cast<long long>(Spec::N + m) * kUnits;
  const Raw* w = static_cast<const Raw*>(p.w);
  const Raw* x = static_cast<const Raw*>(p.x);
  Raw* out = static_cast<Raw*>(p.ws_padded);
  const long long stride = static_cast<long long>(gridDim.x) * kPadThreads;
  for (long long i = static_cast<long long>(blockIdx.x) * kPadThreads + threadIdx.x; i < total;
       i += stride) {
    const long long row = i / kUnits;
    const int col = static_cast<int>(i % kUnits) * kVec;
    const Raw* src = row < Spec::N ? w + row * Spec::LDW : x + (row - Spec::N) * Spec::LDX;
    src += col;
    detail::PadUnit u;
    u.v = make_uint4(0, 0, 0, 0);
    if (col + kVec <= Spec::K) {
#pragma unroll
      for (int j = 0; j < kVec; j += kLoad) detail::pad_load<kLoadBytes>(u, j, src + j);
    } else {
      // The row's last unit: element by element up to K (a wide load could run past x's end).
      for (int j = 0; j < Spec::K - col; ++j) {
        if constexpr (kElem == 2)
          u.h[j] = src[j];
        else
          u.w[j] = src[j];
      }
    }
    *reinterpret_cast<uint4*>(out + row * Spec::KP + col) = u.v;
  }
}

}  // namespace fj
