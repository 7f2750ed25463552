// Helpers of the GPU tests that force a kernel config and draw adversarial inputs. Header-only.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fusejit/device/device_memory.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/verify/verification.hpp"

namespace fusejit::test {

// A plan of exactly `config` (no dispatch, no tuning database). `own_workspace` false: every
// run must be given a workspace, which lets a test poison it and read it back.
inline Plan forced_plan(const Problem& p, const KernelConfig& config, bool own_workspace = true) {
  PlanOptions po;
  po.config = config;
  po.autotune = false;
  po.use_tuning_db = false;
  po.allocate_workspace = own_workspace;
  return Plan(p, po);
}

// A run of `rows` rows of `in` (a case of at least that many) through `plan` on a caller
// workspace poisoned with 0xFF bytes first (y and the saved stats are poisoned by DeviceCase):
// the outputs, and the workspace as the run left it, so that a test can tell which kernels wrote
// which region (WorkspaceLayout's offsets).
struct PoisonedRun {
  CaseOutputs out;
  std::vector<unsigned char> workspace;
  // Whether any byte of [offset, offset + bytes) lost the poison.
  bool written(std::size_t offset, std::size_t bytes) const {
    return std::any_of(workspace.begin() + static_cast<std::ptrdiff_t>(offset),
                       workspace.begin() + static_cast<std::ptrdiff_t>(offset + bytes),
                       [](unsigned char b) { return b != 0xFF; });
  }
  // The region's bytes as `bytes / sizeof(T)` values.
  template <class T>
  std::vector<T> region(std::size_t offset, std::size_t bytes) const {
    std::vector<T> v(bytes / sizeof(T));
    std::memcpy(v.data(), workspace.data() + offset, v.size() * sizeof(T));
    return v;
  }
};
inline PoisonedRun run_poisoned(const Plan& plan, const CaseInputs& in, std::int64_t rows,
                                bool with_saved) {
  DeviceCase dc(in, with_saved);
  DeviceBuffer ws(plan.workspace_size());
  ws.fill_bytes(0xFF);
  const Stream st;
  plan.run(st, dc.tensors(), rows, ws.get(), plan.workspace_size());
  st.synchronize();
  PoisonedRun r;
  r.out = dc.download(rows);
  r.workspace.resize(plan.workspace_size());
  ws.download(r.workspace.data(), r.workspace.size());
  return r;
}

// x ~ 1000 + N(0, 1) from the case's seed: every column's mean ~1000 times its spread, where a
// schedule that loses digits in the statistics or in y shows it.
inline void make_x_large_mean(CaseInputs& in) {
  const Problem& p = in.c.problem;
  std::mt19937_64 rng(in.seed);
  std::normal_distribution<double> normal;
  for (std::int64_t m = 0; m < p.M; ++m)
    for (std::int64_t k = 0; k < p.K; ++k)
      in.x.set(static_cast<std::size_t>(m * p.lda_x() + k),
               static_cast<float>(1000.0 + normal(rng)));
}

// The first `rows` rows of `in` (a case of at least that many) as the op computed them, `got`,
// against the float64 reference of those rows by the sweep's rule; `why` says what failed.
inline bool rows_pass_float64(const CaseInputs& in, const CaseOutputs& got, std::int64_t rows,
                              std::string* why) {
  CaseInputs sub = in;
  sub.c.problem.M = rows;
  const ReferenceOutputs ref = reference_forward(
      reference_inputs(sub), reference_settings(sub.c.problem, in.num_batches_tracked));
  return passes(compare(sub, got, ref), sweep_threshold(sub.c.problem.dtype), why);
}

}  // namespace fusejit::test
