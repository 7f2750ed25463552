#include "fusejit/problem.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "common/limits.h"
#include "fusejit/error.hpp"

namespace fusejit {

namespace {

// The public limits (problem.hpp) are the kernels' (templates/common/limits.h).
static_assert(kMaxDim == fj::kMaxDim);
// Row strides are int fields of the kernels' Spec; every offset computed from one is 64-bit.
constexpr std::int64_t kMaxStride = std::numeric_limits<std::int32_t>::max();

void require(bool ok, const char* arg, const char* what) {
  if (!ok) [[unlikely]]
    throw InvalidArgument(arg, what);
}

// The message is formatted only when the check fails: a hot Plan validates its problem every
// time, and a dozen formatted strings cost more than the rest of a cached plan lookup.
template <class... A>
void require(bool ok, const char* arg, fmt::format_string<A...> f, A&&... a) {
  if (!ok) [[unlikely]]
    throw InvalidArgument(arg, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace

Shape parse_shape(std::string_view text) {
  Shape s;
  std::int64_t* dims[3] = {&s.M, &s.N, &s.K};
  std::string_view rest = text;
  for (int i = 0; i < 3; ++i) {
    auto x = rest.find('x');
    std::string_view part = i < 2 ? rest.substr(0, x) : rest;
    if ((i < 2 && x == std::string_view::npos) || part.empty())
      throw InvalidArgument("shape",
                            "expected MxNxK (e.g. 1024x8192x8192); got '" + printable(text) + "'");
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), *dims[i]);
    if (ec != std::errc() || p != part.data() + part.size() || *dims[i] < 1)
      throw InvalidArgument("shape", "expected MxNxK with each size in 1.." +
                                         std::to_string(kMaxDim) + "; got '" + printable(text) +
                                         "'");
    if (*dims[i] > kMaxDim)
      throw InvalidArgument(
          "shape", fmt::format("{} = {} is above {} (2^31 - 257: the kernels count tiles in 32-bit "
                               "int); got '{}'",
                               "MNK"[i], *dims[i], kMaxDim, printable(text)));
    if (i < 2) rest = rest.substr(x + 1);
  }
  return s;
}

std::string format_shape(const Shape& s) {
  return fmt::format("{}x{}x{}", s.M, s.N, s.K);
}

void Problem::validate() const {
  // Above kMaxDim the kernels' 32-bit tile counts, (D + tile - 1) / tile, would overflow.
  for (const auto& [arg, v] : {std::pair{"M", M}, std::pair{"N", N}, std::pair{"K", K}})
    require(v >= 1 && v <= kMaxDim, arg,
            "expected 1 <= {} <= {} (2^31 - 257: the kernels count tiles in 32-bit "
            "int), got {}",
            arg, kMaxDim, v);
  // A synchronized rank may hold a single row: the statistics are the global batch's.
  require(mode == Mode::eval || M >= 2 || stat_ranks > 0, "M",
          "train mode needs at least 2 rows per feature (batch statistics of 1 row are "
          "undefined, as in PyTorch); got M=1");
  require(stat_ranks >= 0 && stat_ranks <= kMaxStatRanks, "stat_ranks",
          "expected 0 (unsynchronized) or a rank count in 1..{}, got {}", kMaxStatRanks,
          stat_ranks);
  require(stat_ranks == 0 || mode == Mode::train, "stat_ranks",
          "expected 0 in eval mode (it normalizes with the running stats: there are no batch "
          "statistics to synchronize), got {}",
          stat_ranks);
  require(param_dtype == DType::fp32 || param_dtype == storage_type(dtype), "param_dtype",
          "expected fp32 or {} (the storage type of x), got {}", name(storage_type(dtype)),
          name(param_dtype));
  require(ldx == 0 || ldx >= K, "ldx", "expected 0 (packed) or >= K={}, got {}", K, ldx);
  require(ldw == 0 || ldw >= K, "ldw", "expected 0 (packed) or >= K={}, got {}", K, ldw);
  require(ldy == 0 || ldy >= N, "ldy", "expected 0 (packed) or >= N={}, got {}", N, ldy);
  for (const auto& [arg, v] :
       {std::pair{"ldx", lda_x()}, std::pair{"ldw", lda_w()}, std::pair{"ldy", lda_y()}})
    require(v <= kMaxStride, arg,
            "expected a row stride <= {} (a 32-bit int in the kernels), got {}", kMaxStride, v);
  const auto eb = static_cast<int>(storage_bytes(dtype));
  require(alignment == 0 || alignment == 16 || alignment == 8 || alignment == 4 || alignment == 2 ||
              alignment == 1,
          "alignment", "expected 0 (automatic), 16, 8, 4, 2 or 1 bytes, got {}", alignment);
  const int align = effective_alignment();
  require(align >= eb, "alignment",
          "{} elements are {} bytes, so pointers are at least {}-byte aligned; got {}", name(dtype),
          eb, eb, align);
  require(lda_x() * eb % align == 0, "ldx",
          "row stride of x ({} bytes) is not a multiple of the promised alignment {}", lda_x() * eb,
          align);
  require(lda_w() * eb % align == 0, "ldw",
          "row stride of W ({} bytes) is not a multiple of the promised alignment {}", lda_w() * eb,
          align);
  require(lda_y() * eb % align == 0, "ldy",
          "row stride of y ({} bytes) is not a multiple of the promised alignment {}", lda_y() * eb,
          align);
  require(std::isfinite(eps) && eps > 0, "eps", "expected a finite eps > 0, got {}", eps);
  require(!momentum || (std::isfinite(*momentum) && *momentum >= 0 && *momentum <= 1), "momentum",
          "expected momentum in [0, 1] or None, got {}", momentum.value_or(0));
}

int Problem::effective_alignment() const {
  if (alignment) return alignment;
  const auto eb = static_cast<std::int64_t>(storage_bytes(dtype));
  int a = 16;
  for (std::int64_t ld : {lda_x(), lda_w(), lda_y()})
    a = std::min(a, natural_alignment(0, ld * eb));
  return a;
}

std::string Problem::key() const {
  return fmt::format("{}x{}x{}:{}:p{}:{}:bias{}:scale{}:affine{}:ld{},{},{}:al{}:eps{:a}:mom{}", M,
                     N, K, name(dtype), name(param_dtype), name(mode), int(has_bias),
                     int(has_scale), int(has_affine), lda_x(), lda_w(), lda_y(),
                     effective_alignment(), eps,
                     momentum ? fmt::format("{:a}", *momentum) : std::string("none")) +
         // Only when set, so unsynchronized problems keep the keys (tuning database, caches)
         // they had before the field existed.
         (stat_ranks ? fmt::format(":ranks{}", stat_ranks) : std::string());
}

int natural_alignment(std::uintptr_t address, std::int64_t row_stride_bytes) {
  for (int a : {16, 8, 4, 2})
    if (address % a == 0 && row_stride_bytes % a == 0) return a;
  return 1;
}

}  // namespace fusejit
