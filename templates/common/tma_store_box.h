// The box of the per-warp TMA stores (epilogue/warp_box_store.cuh: the forward's y and the
// gradient GEMMs' dX and dW), shared verbatim by the templates and the host, which encodes the
// tensor maps (plan/tma_descriptor.cpp) and counts shared memory with it. Plain C++.
#pragma once

namespace fj {

constexpr int kTmaStoreBoxRows = 16, kTmaStoreBoxRowBytes = 64;
// What one consumer warp owns: two boxes, filled alternately.
constexpr int kTmaStoreWarpBytes = 2 * kTmaStoreBoxRows * kTmaStoreBoxRowBytes;

}  // namespace fj
