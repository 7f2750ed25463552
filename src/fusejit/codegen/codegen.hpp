// (Problem, KernelConfig) -> KernelSource: a short generated prelude of constexpr values
// (struct Spec), the template includes and the extern "C" kernels one run launches.
// Deterministic: the same inputs give byte-identical text, which is what keys the caches.
#pragma once
#include <string>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// Which kernels a run launches, in order, and their names in the generated source.
struct KernelSchedule {
  bool single_pass = false;    // train: the GEMM's epilogue sees whole columns (one row tile)
  bool fold_finalize = false;  // train, two-pass: fj_apply merges the partials itself
  // Split-K (tiled, split_k > 1): fj_gemm leaves fp32 slices, fj_splitk_reduce adds them and runs
  // the epilogue; the kernels after it are the unsplit schedule's.
  bool split_k = false;
  std::vector<std::string> kernels;  // e.g. {"fj_gemm", "fj_splitk_reduce", "fj_finalize", ...}
};
KernelSchedule schedule(const Problem&, const KernelConfig&);

KernelSource generate(const Problem&, const KernelConfig&);

// The embedded templates as NVRTC headers (include name, contents).
const std::vector<std::pair<std::string, std::string>>& template_headers();

}  // namespace fusejit
