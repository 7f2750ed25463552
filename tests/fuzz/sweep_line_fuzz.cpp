// parse_sweep_line (sweep files for `fusejit check --sweep FILE`): any line is a case or an
// InvalidArgument; a parsed case is a valid problem, and its text() parses back to a case with
// the same text.
#include <cstdint>
#include <string>

#include "fusejit/error.hpp"
#include "fusejit/verify/verification.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string line = fusejit::fuzz::as_string(data, size);
  fusejit::SweepCase c;
  try {
    c = fusejit::parse_sweep_line(line);
  } catch (const fusejit::InvalidArgument&) {
    return 0;
  }
  try {
    c.problem.validate();
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(false, "parsed an invalid problem: %s", e.what());
  }
  const std::string text = c.text();
  fusejit::SweepCase again;
  try {
    again = fusejit::parse_sweep_line(text);
  } catch (const fusejit::InvalidArgument& e) {
    FJ_FUZZ_CHECK(false, "text() '%s' does not parse: %s", text.c_str(), e.what());
  }
  FJ_FUZZ_CHECK(again.text() == text, "'%s' re-parses as '%s'", text.c_str(), again.text().c_str());
  FJ_FUZZ_CHECK(again.problem.key() == c.problem.key(), "'%s': problem changed: %s vs %s",
                text.c_str(), c.problem.key().c_str(), again.problem.key().c_str());
  return 0;
}
