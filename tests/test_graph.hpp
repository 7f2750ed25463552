// Helpers of the GPU tests that replay runs from CUDA graphs and compare outputs bit for bit.
// Header-only.
#pragma once
#include <cuda.h>

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/device/driver.hpp"
#include "fusejit/verify/verification.hpp"

namespace fusejit::test {

// Bit for bit: the decoding to double is exact and one-to-one, so equal bytes of the doubles
// mean equal bytes on the GPU (and a -0 against a +0, or two NaNs, are told apart too).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// The first output whose bits differ between two runs of a case ("y", "saved", "running_mean",
// "running_var", "save_mean", "save_invstd", "num_batches_tracked"), or "" when all agree;
// `saved` only where both runs wrote it.
inline std::string first_different_output(const CaseOutputs& a, const CaseOutputs& b) {
  const std::pair<const char*, const std::vector<double> CaseOutputs::*> fields[] = {
      {"y", &CaseOutputs::y},
      {"saved", &CaseOutputs::saved},
      {"running_mean", &CaseOutputs::running_mean},
      {"running_var", &CaseOutputs::running_var},
      {"save_mean", &CaseOutputs::save_mean},
      {"save_invstd", &CaseOutputs::save_invstd}};
  for (const auto& [name, field] : fields) {
    if (field == &CaseOutputs::saved && ((a.*field).empty() || (b.*field).empty())) continue;
    if (!same_bits(a.*field, b.*field)) return name;
  }
  return a.num_batches_tracked == b.num_batches_tracked ? "" : "num_batches_tracked";
}

// Captures what `enqueue` puts on `stream` into a graph, launches it `launches` times on the
// stream and waits. Thread-local capture: NCCL's own threads, which a synchronized run wakes,
// may make calls that a global capture would refuse.
inline void replay_captured(CUstream stream, const std::function<void()>& enqueue, int launches) {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  FJ_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  enqueue();
  FJ_CU(cuStreamEndCapture(stream, &graph));
  FJ_CU(cuGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < launches; ++i) FJ_CU(cuGraphLaunch(exec, stream));
  FJ_CU(cuStreamSynchronize(stream));
  FJ_CU(cuGraphExecDestroy(exec));
  FJ_CU(cuGraphDestroy(graph));
}

}  // namespace fusejit::test
