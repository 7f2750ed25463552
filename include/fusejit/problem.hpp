// What to compute: y = BatchNorm1d(scale * (x W^T + b)) for one layer, independent of any GPU.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fusejit/dtype.hpp"

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

// The largest M, N and K (2^31 - 257): the kernels compute tile counts as (D + T - 1) / T in
// 32-bit int with tiles T of up to 256 (templates/common/limits.h, kMaxDim). Row strides may go
// up to 2^31 - 1; products such as M x N and row offsets are 64-bit in the kernels.
inline constexpr std::int64_t kMaxDim = (std::int64_t{1} << 31) - 257;

// The most ranks Problem::stat_ranks may name (the gathered statistics are R x (8 N + 16) bytes
// of workspace).
inline constexpr int kMaxStatRanks = 65536;

struct Shape {
  std::int64_t M = 0, N = 0, K = 0;
};
// "MxNxK" (x is MxK, W is NxK, y is MxN), each in 1..kMaxDim. Throws InvalidArgument("shape",
// ...).
Shape parse_shape(std::string_view text);
std::string format_shape(const Shape&);

struct Problem {
  std::int64_t M = 0, N = 0, K = 0;
  DType dtype = DType::bf16;
  // Storage type of bias, scale, gamma, beta and the running stats: fp32, or the storage type
  // of x (a model cast with .to(bf16) holds its parameters in bf16).
  DType param_dtype = DType::fp32;
  Mode mode = Mode::train;
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative moving average (momentum=None)
  bool has_bias = true;
  bool has_scale = true;
  bool has_affine = true;  // BatchNorm gamma/beta
  // Row strides in elements; 0 means packed (K, K and N).
  std::int64_t ldx = 0, ldw = 0, ldy = 0;
  // Byte alignment the caller promises for x, W and y and their row strides (16, 8, 4, 2; 1 is
  // accepted only where an element is 1 byte, so never today). 0 (the default) means the widest
  // alignment the row strides allow, up to 16. Wider alignment lets the kernels use wider loads;
  // run() checks every pointer against it.
  int alignment = 0;
  // Train, data-parallel: the number of ranks whose rows form one BatchNorm batch (what
  // nn.SyncBatchNorm computes). 0 (the default): the statistics are this run's rows alone.
  // R >= 1: every rank runs a plan of this problem over its own rows (any count from 0 to M,
  // ragged allowed) and the plans exchange per-column (count, mean, M2) over
  // PlanOptions::stats_comm, a communicator of exactly R ranks; y, the saved stats and the
  // running stats (updated with the global unbiased variance) are those of the global batch,
  // bit-identical on every rank. Eval mode takes 0 (it normalizes with the running stats).
  int stat_ranks = 0;

  std::int64_t lda_x() const { return ldx ? ldx : K; }
  std::int64_t lda_w() const { return ldw ? ldw : K; }
  std::int64_t lda_y() const { return ldy ? ldy : N; }
  Shape shape() const { return {M, N, K}; }
  // `alignment`, or for 0 the widest (<= 16 bytes) that every row stride allows.
  int effective_alignment() const;

  // Throws InvalidArgument naming the first offending field.
  void validate() const;
  // Stable text naming every field that changes the kernels or their results.
  std::string key() const;
};

// The widest alignment (16, 8, 4 or 2 bytes) that a pointer and row stride both satisfy.
int natural_alignment(std::uintptr_t address, std::int64_t row_stride_bytes);

}  // namespace fusejit
#pragma GCC visibility pop
