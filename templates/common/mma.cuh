// Warp-level tensor-core building blocks (sm_80+): ldmatrix fragment loads and mma.sync, as
// inline PTX. Fragments are plain unsigned registers so one code path serves fp16, bf16 and
// tf32 (tf32 fragments are fp32 bit patterns, one element per register).
#pragma once
#include "common/math_kind.cuh"

namespace fj {

// Four 8x8 matrices of 16-bit elements (equivalently 8x4 of 32-bit ones): lanes 8q..8q+7 give
// the row addresses of matrix q, and each lane receives, per matrix, the 32-bit word at
// (row = lane / 4, word = lane % 4). That is exactly the mma.sync A/B fragment layout.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two matrices; lanes 0..15 give the addresses.
__device__ __forceinline__ void ldmatrix_x2(unsigned& r0, unsigned& r1, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}
// The same with .trans: each 8x8 matrix is transposed on the way, so lane l receives the
// 16-bit elements at (row 2 * (l % 4), col l / 4) and (row 2 * (l % 4) + 1, col l / 4) of the
// matrix as stored (element (l / 4, 2 * (l % 4) + 0..1) of its transpose). That turns a tile
// stored [k][mn] (the output index contiguous) into the same fragments ldmatrix gives from
// [mn][k]. 16-bit elements only: 32-bit ones would be split in halves.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned& r0, unsigned& r1, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

// fp32 -> tf32, round to nearest with ties away from zero (what cvt.rna.tf32.f32 and cuBLAS's
// conversion give), returned as the fp32 bit pattern the tf32 mma consumes. The tensor core
// ignores the low 13 mantissa bits, so adding half a tf32 ulp (0x1000) and letting it truncate
// rounds exactly like cvt.rna for every finite input, carries into the exponent included. It
// costs 2 instructions; cvt.rna.tf32 is emulated in about 5 on sm_80/sm_90, which made the tf32
// mainloop issue-bound. Inf and NaN are left as they are (adding to Inf would make a NaN).
// Feeding raw fp32 bits instead (Spec::TF32_ROUND = false) truncates: biased toward zero.
__device__ __forceinline__ unsigned to_tf32(unsigned f32_bits) {
  return fabsf(__uint_as_float(f32_bits)) < __uint_as_float(0x7f800000u) ? f32_bits + 0x1000u
                                                                         : f32_bits;
}

// How a tf32 GEMM takes its fp32 operands: rounded to nearest with ties away from zero (to_tf32:
// the tiled kernel's fragments), to nearest with ties to even (the copy engine, loading through
// a CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 map: warpspec's stages; seen on H200 at the ties), or
// truncated (raw bits, the low 13 mantissa bits ignored by the tensor core).
enum class Tf32Rounding { nearest_away, nearest_even, truncate };

// The value a tf32 product takes for the fp32 operand v under R, for code that must agree with
// a GEMM's products without running them (InputStats' statistics of x W^T). Inf stays Inf; a
// NaN stays NaN unless its payload lies in the low 13 bits alone, which the tensor core too
// reads as Inf.
template <Tf32Rounding R>
__device__ __forceinline__ float tf32_operand_value(float v) {
  if constexpr (R == Tf32Rounding::nearest_even) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // One conversion: the same rounding in bit arithmetic (six integer instructions) made the
    // 65536x256x64 tf32 `.cv` run take 0.0574 ms against 0.0520 unrounded (fj_input_stats 33.0
    // us against 26.7 under ncu, 25% more instructions), the conversion 0.0525 (27.7 us, 6%
    // more; H200).
    unsigned t;
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(t) : "f"(v));
    return __uint_as_float(t & 0xffffe000u);
#elif defined(__CUDA_ARCH__)
    // Only warpspec's copy engine rounds ties to even, and warpspec is sm_90 only.
    static_assert(R != Tf32Rounding::nearest_even, "tf32 ties to even: sm_90 and later");
#else
    return v;  // a host pass, which never runs device code
#endif
  } else if constexpr (R == Tf32Rounding::nearest_away) {
    return __uint_as_float(to_tf32(__float_as_uint(v)) & 0xffffe000u);
  } else {
    return __uint_as_float(__float_as_uint(v) & 0xffffe000u);
  }
}

// 3xTF32 (kMathTf32x3): x = big + small, big = x rounded to tf32 (nearest, exactly the value
// the tensor core multiplies) and small = x - big, exact in fp32 (big keeps x's leading 11
// bits), returned through to_tf32 so the core rounds it to nearest too. big * big + big * small
// + small * big then misses only small * small and small's own rounding, ~2^-22 of |x| per
// operand, against strict fp32's 2^-24 per product (CUTLASS's "3xTF32"). A big that rounds up
// past the largest finite value is truncated instead (x stays finite, small stays exact); Inf and
// NaN pass through as big with a zero small.
//
// Selects, not branches: with a branch per element around the finite case, the split of a
// warpspec stage ran as a serial chain per thread and 3xTF32 took 7.5x tf32's time (ncu:
// tensor pipe 33% busy, no eligible warp 69% of cycles, fixed-latency dependencies the top
// stall; docs/performance.md, "3xTF32").
__device__ __forceinline__ void split_tf32(unsigned x, unsigned& big, unsigned& small) {
  const bool finite = fabsf(__uint_as_float(x)) < __uint_as_float(0x7f800000u);
  const unsigned up = (x + 0x1000u) & 0xffffe000u;
  const unsigned b = (up & 0x7f800000u) == 0x7f800000u ? (x & 0xffffe000u) : up;
  // to_tf32 without its finite test: for a finite x, small is finite.
  const unsigned s = __float_as_uint(__uint_as_float(x) - __uint_as_float(b)) + 0x1000u;
  big = finite ? b : x;
  small = finite ? s : 0u;
}

// 3xTF32 where the big part is x itself: the tensor core reads a tf32 operand's top 19 bits, so
// x left as it is multiplies as big = x truncated, and only small = x - big (exact in fp32,
// rounded through to_tf32) needs storing, which saves writing big back. The price: small is up
// to 2^-10 of |x| and always has x's sign, so small * small, the product left out, is biased
// unless the other operand's split is rounded (warpspec splits x with split_tf32 and W with
// this: docs/performance.md, "3xTF32"). Inf and NaN give a zero small; the core reads them as
// plain tf32 does (a NaN whose payload is all in the low 13 bits multiplies as Inf there too).
__device__ __forceinline__ unsigned tf32_small_of_truncated(unsigned x) {
  const bool finite = fabsf(__uint_as_float(x)) < __uint_as_float(0x7f800000u);
  const unsigned s =
      __float_as_uint(__uint_as_float(x) - __uint_as_float(x & 0xffffe000u)) + 0x1000u;
  return finite ? s : 0u;
}

// D = A * B + D for one 16x8 fp32 accumulator tile (row-major A 16xK, "col" B = [n][k] in
// memory, which is the nn.Linear weight layout as it is). Per lane: d[0..1] at
// (row lane/4, cols 2*(lane%4) + 0..1), d[2..3] the same 8 rows further down.
template <int MATH>
__device__ __forceinline__ void mma_16x8(float (&d)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
  if constexpr (MATH == kMathBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (MATH == kMathFp16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    // kMathTf32x3 multiplies its split parts with this same tf32 instruction.
    static_assert(MATH == kMathTf32 || MATH == kMathTf32x3,
                  "mma_16x8: MATH must be kMathBf16, kMathFp16, kMathTf32 or kMathTf32x3");
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

}  // namespace fj
