// The output of codegen and the input of the compiler: one translation unit and how to build it.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace fusejit {

struct KernelSource {
  std::string name;  // human-readable, e.g. "fj.bf16.train.1024x8192x8192.tiled.128x128x32..."
  std::string text;  // the generated translation unit (prelude + #include + instantiations)
  std::vector<std::string> options;  // NVRTC options besides the target architecture
  // Headers the text may #include, as (include name, contents): the embedded templates.
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> kernels;  // extern "C" kernel names the text defines
};

}  // namespace fusejit
