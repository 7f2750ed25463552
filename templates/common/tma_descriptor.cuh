// The opaque 128-byte tensor map (CUtensorMap) that the host encodes with
// cuTensorMapEncodeTiled and passes by value as a __grid_constant__ kernel parameter. The
// templates never look inside it; they hand its address to cp.async.bulk.tensor. Declared here
// rather than taken from cuda.h because NVRTC compiles the templates header-free.
#pragma once

namespace fj {

struct alignas(64) TmaDescriptor {
  unsigned long long v[16];
};
static_assert(sizeof(TmaDescriptor) == 128, "TmaDescriptor must match CUtensorMap");

}  // namespace fj
