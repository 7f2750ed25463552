// Problem helpers for the tests. Header-only.
#pragma once
#include <string>

#include "fusejit/error.hpp"
#include "fusejit/problem.hpp"

namespace fusejit::test {

// The argument Problem::validate names when it refuses `p`, or "(accepted)".
inline std::string rejected_argument(const Problem& p) {
  try {
    p.validate();
  } catch (const InvalidArgument& e) {
    return e.argument();
  }
  return "(accepted)";
}

}  // namespace fusejit::test
