// The library's side of kernel configs: the candidates it considers, the heuristic's pick, the
// time model that orders them, and the layout constants host code shares with the templates.
#pragma once
#include <optional>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/kernel_config.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// The warpspec TMA-store epilogue's box (FragmentBnEpilogue's kBoxRows x kBoxRowBytes in
// templates/epilogue/fragment_bn_epilogue.cuh): each consumer warp owns two, and y's tensor map
// is encoded with this box.
inline constexpr int kTmaStoreBoxRows = 16;
inline constexpr int kTmaStoreBoxRowBytes = 64;

// A rough time model (waves x tile time + extra passes) that orders candidates until the
// autotuner measures them.
double estimated_us(const Problem&, const Device&, const KernelConfig&);

// The configs fusejit considers for a problem on a device (both variants where they apply),
// each valid_for it. The first is the built-in heuristic's choice.
std::vector<KernelConfig> candidate_configs(const Problem&, const Device&);
// The heuristic's choice, optionally restricted to one variant. Throws InvalidArgument
// ("variant", ...) when that variant cannot run the problem on the device.
KernelConfig default_config(const Problem&, const Device&, std::optional<Variant> variant = {});

}  // namespace fusejit
