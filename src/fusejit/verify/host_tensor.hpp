// Host-side data for checks and benchmarks: fp32 <-> fp16/bf16 conversion (round to nearest
// even, as the GPU's cvt.rn does), host arrays in a dtype's storage format, random fills as
// KernelBench draws its inputs, and NaN poison patterns.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fusejit/dtype.hpp"

namespace fusejit {

// IEEE binary16. Round to nearest even; overflow gives +-inf; NaN stays NaN (quiet, sign kept);
// results below the smallest subnormal round to +-0 or to it.
std::uint16_t float_to_half_bits(float v);
float half_bits_to_float(std::uint16_t bits);  // exact
// bfloat16 (the upper half of an fp32). Round to nearest even; NaN stays NaN.
std::uint16_t float_to_bf16_bits(float v);
float bf16_bits_to_float(std::uint16_t bits);  // exact

// `v` as the storage type of `dtype` holds it (fp32 and tf32 store fp32: unchanged).
float round_to_storage(DType dtype, float v);
// `v` as the tensor cores see it in tf32 math: 10 mantissa bits, rounded to nearest with ties
// away from zero (what the tiled kernels do; cvt.rna.tf32.f32). Inf and NaN unchanged.
float round_to_tf32(float v);
// `v` as a tensor core reads an fp32 operand that was not rounded first: the top 10 mantissa bits,
// the rest dropped (truncation toward zero; PyTorch's numerical-accuracy notes say the same of
// cuBLAS's tf32). Inf and NaN unchanged.
float truncate_to_tf32(float v);

// How x is drawn: centred ~ N(0, 1) (torch.randn); non_centred ~ U[0, 1) (torch.rand, what
// KernelBench uses: every column of x W^T then has a mean large against its spread).
enum class Distribution { centred, non_centred };
std::string_view name(Distribution);
Distribution parse_distribution(std::string_view);  // throws InvalidArgument("distribution")

// A seed from std::random_device (so repeated checks see different data unless a seed is given).
std::uint64_t fresh_seed();

// A host array in a dtype's storage format (fp32, fp16 or bf16 bytes), exactly what is
// uploaded to the GPU; get() decodes exactly, so a reference computed from get() sees the same
// rounded values the GPU saw.
class HostTensor {
 public:
  HostTensor() = default;
  // `count` elements of storage_type(dtype), every byte zero.
  HostTensor(DType dtype, std::size_t count);

  DType dtype() const { return dtype_; }  // always a storage type: fp32, fp16 or bf16
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return bytes_.size(); }
  bool empty() const { return count_ == 0; }
  const void* data() const { return bytes_.data(); }
  void* data() { return bytes_.data(); }

  float get(std::size_t i) const;
  void set(std::size_t i, float v);  // rounds to the storage type
  std::vector<double> to_doubles() const;
  // Rows [0, rows) x columns [0, cols) of a row-major [rows][ld] array, packed, as doubles.
  std::vector<double> packed(std::size_t rows, std::size_t cols, std::size_t ld) const;
  // Every element := NaN (nan_bits16 / a quiet fp32 NaN).
  void poison();

 private:
  DType dtype_ = DType::fp32;
  std::size_t count_ = 0;
  std::vector<unsigned char> bytes_;
};

// Fills every element with independent draws, rounded to the storage type. A draw that rounds
// to zero is drawn again, so no element is ever zero. Without `seed` a fresh one is used; the
// seed used is returned so a failure can be reproduced.
std::uint64_t fill_normal(HostTensor& t, double mean, double stddev,
                          std::optional<std::uint64_t> seed = {});
std::uint64_t fill_uniform(HostTensor& t, double lo, double hi,
                           std::optional<std::uint64_t> seed = {});
// N(0, 1) or U[0, 1), as for x.
std::uint64_t fill_random(HostTensor& t, Distribution d, std::optional<std::uint64_t> seed = {});

// Poison patterns that read as NaN in the storage type of `dtype`.
std::uint16_t nan_bits16(DType dtype);  // fp16: 0x7E00, bf16: 0x7FC0 (throws for 32-bit types)
// A 32-bit word made of NaNs of the storage type: one fp32 NaN or two 16-bit NaNs.
std::uint32_t nan_word(DType dtype);

}  // namespace fusejit
