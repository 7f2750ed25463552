// The kernels' static requirements on sizes and shapes, written once: the templates check them
// in static_asserts and the host in Problem::validate and KernelConfig::why_invalid, so a problem
// and config the host accepts compile, and nothing the kernels compute in 32-bit int overflows.
// Plain C++ (no CUDA headers), like split_k.h.
#pragma once
#include "common/host_device.h"

namespace fj {

constexpr long long kIntMax = 2147483647;  // INT_MAX without <climits>

// The largest BM, BN and BK a kernel is instantiated with (KernelConfig::why_invalid refuses
// more). Every kernel counts tiles as (D + T - 1) / T in int, evaluated as (D + T) - 1, so
// M, N and K must stay kMaxTileExtent below 2^31 - 1: that is kMaxDim (Problem::validate). It
// also covers the BatchNorm passes' (N + 32 * VEC - 1) / (32 * VEC) (VEC <= 8) and (M + 63) / 64.
constexpr int kMaxTileExtent = 256;
constexpr long long kMaxDim = kIntMax - kMaxTileExtent;

// bn_apply's block (kernels/bn_apply.cuh): kApplyRowThreads x kApplyColThreads threads, each
// rewriting kApplyRows consecutive rows of VEC columns, so a block covers kApplyBlockRows rows of
// kApplyColThreads x VEC columns; its grid has one block per such patch of y (the host bounds
// their count in KernelConfig::why_invalid).
constexpr int kApplyRows = 8;
constexpr int kApplyColThreads = 32;
constexpr int kApplyRowThreads = 8;
constexpr int kApplyThreads = kApplyColThreads * kApplyRowThreads;
constexpr int kApplyBlockRows = kApplyRows * kApplyRowThreads;

// fj_pad_operands' block (kernels/pad_operands.cuh); its grid-stride loop takes any grid.
constexpr int kPadThreads = 256;

// True when `count` (a 64-bit exact value of something a kernel computes in int) fits int.
FJ_HOST_DEVICE constexpr bool fits_int(long long count) {
  return count >= -kIntMax - 1 && count <= kIntMax;
}

// BnEpilogue<Spec, NT> (epilogue/bn_epilogue.cuh): NT threads split BN columns, several threads
// per column or several columns per thread, so one must divide the other.
FJ_HOST_DEVICE constexpr bool epilogue_threads_nest(int threads, int bn) {
  return threads > 0 && bn > 0 && (threads >= bn ? threads % bn == 0 : bn % threads == 0);
}

}  // namespace fj
