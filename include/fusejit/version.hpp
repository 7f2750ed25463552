// Which fusejit this is ("0.1.0"): the library's version, not the header's, so an application
// can log what it runs against.
#pragma once
#include <string_view>

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

std::string_view version();

}  // namespace fusejit
#pragma GCC visibility pop
