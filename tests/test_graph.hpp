// Helpers of the GPU tests that replay runs from CUDA graphs and compare outputs bit for bit.
// Header-only.
#pragma once
#include <cuda.h>

#include <cstring>
#include <functional>
#include <vector>

#include "fusejit/device/driver.hpp"

namespace fusejit::test {

// Bit for bit: the decoding to double is exact and one-to-one, so equal bytes of the doubles
// mean equal bytes on the GPU (and a -0 against a +0, or two NaNs, are told apart too).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
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
