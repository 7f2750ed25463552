// The kernel templates (templates/), compiled into the library by cmake/embed_templates.cmake.
#pragma once
#include <string_view>
#include <vector>

namespace fusejit {

struct EmbeddedFile {
  std::string_view name;  // path relative to templates/, e.g. "common/types.cuh"
  std::string_view text;
};

const std::vector<EmbeddedFile>& embedded_templates();

}  // namespace fusejit
