// What ptxas says about each function of a cubin it assembles (NVRTC's log under
// --ptxas-options=-v): registers, stack frame and spills. A spill is invisible in a kernel's
// results and costs it local-memory traffic on its hottest path (a 388-byte spill in a resident
// train GEMM's epilogue was found only by compiling the emitted source with nvcc -Xptxas -v), so
// the compiler reports it, and a CPU test holds the heuristic's Hopper kernels to none beyond a
// listed few (tests/cpu/ptxas_spill_test.cpp).
#pragma once
#include <string>
#include <vector>

namespace fusejit {

struct FunctionResources {
  std::string name;    // as ptxas names it (entry functions by their extern "C" names)
  bool entry = false;  // a kernel; false: a device function ptxas kept out of line
  int registers = -1;  // -1: the log did not say (device functions)
  long long stack_frame_bytes = 0;
  long long spill_store_bytes = 0;
  long long spill_load_bytes = 0;

  bool spills() const { return spill_store_bytes > 0 || spill_load_bytes > 0; }
};

// An NVRTC log read in one pass: the functions the ptxas -v report describes (in the log's order)
// and the rest, what the compiler said besides, e.g. its warnings (ptxas prints some of those as
// "ptxas info" lines too, such as C7514 on serialized wgmma; they stay in `rest`).
struct PtxasReport {
  std::vector<FunctionResources> functions;
  std::string rest;
};
PtxasReport read_ptxas_report(const std::string& log);

// "fj_gemm 388 B stored / 412 B loaded, fj_apply ..." for the functions that spill; empty when
// none does.
std::string describe_spills(const std::vector<FunctionResources>& functions);

}  // namespace fusejit
