#include "fusejit/version.hpp"

#ifndef FUSEJIT_VERSION
#define FUSEJIT_VERSION "unknown"
#endif

namespace fusejit {

std::string_view version() {
  return FUSEJIT_VERSION;
}

}  // namespace fusejit
