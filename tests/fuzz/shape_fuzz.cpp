// parse_shape / format_shape: any text either parses to sizes in 1..kMaxDim or is rejected with
// InvalidArgument("shape"); what parses prints back to text that parses to the same shape.
#include <cstdint>
#include <string>

#include "fusejit/error.hpp"
#include "fusejit/problem.hpp"
#include "fuzz_check.hpp"

namespace {

bool in_range(std::int64_t v) {
  return v >= 1 && v <= fusejit::kMaxDim;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = fusejit::fuzz::as_string(data, size);
  fusejit::Shape s;
  try {
    s = fusejit::parse_shape(text);
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(e.argument() == "shape", "rejected with argument '%s'", e.argument().c_str());
    return 0;
  }
  FJ_FUZZ_CHECK(in_range(s.M) && in_range(s.N) && in_range(s.K), "accepted out-of-range sizes");
  const std::string printed = fusejit::format_shape(s);
  fusejit::Shape again;
  try {
    again = fusejit::parse_shape(printed);
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(false, "'%s' does not re-parse: %s", printed.c_str(), e.what());
  }
  FJ_FUZZ_CHECK(again.M == s.M && again.N == s.N && again.K == s.K, "'%s' re-parses differently",
                printed.c_str());
  FJ_FUZZ_CHECK(fusejit::format_shape(again) == printed, "format is not canonical");
  // The shape is exactly the M, N and K a Problem gets: it must pass the size checks.
  fusejit::Problem p;
  p.M = s.M, p.N = s.N, p.K = s.K;
  p.mode = fusejit::Mode::eval;  // train additionally rejects M = 1
  try {
    p.validate();
  } catch (const fusejit::InvalidArgument& e) {
    // Only the alignment of the row strides may object (odd K with 16-byte promise).
    FJ_FUZZ_CHECK(e.argument() == "ldx" || e.argument() == "ldw" || e.argument() == "ldy",
                  "parsed shape rejected by Problem::validate: %s", e.what());
  }
  return 0;
}
