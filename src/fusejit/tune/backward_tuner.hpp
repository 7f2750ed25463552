// `fusejit autotune --backward`: the tiles of BackwardPlan's two gradient GEMMs, measured on this
// GPU, verified against the float64 backward, recorded in the database's backward entries
// (tuning_db.hpp), which every later BackwardPlan of the layer's M class reads (dispatch.hpp,
// choose_backward).
//
//   1. candidates (backward_tuning_configs): the heuristic's pair first, then every other dx
//      config grad_gemm_candidates lists beside the heuristic's dw, then every other dw config
//      beside the heuristic's dx. The two GEMMs are separate kernels on the same inputs, so the
//      lists are searched one at a time: |dx| + |dw| - 1 kernel sets rather than |dx| x |dw|;
//   2. compile them in parallel, time whole backward runs (every gradient, `saved` from a real
//      forward run) the way tune() times the forward (measure.hpp);
//   3. the pair of the fastest dx and the fastest dw, when it is not among them yet, is built
//      and timed side by side with the fastest so far;
//   4. verify in order of time until one passes: the float64 backward of the same dy and of what
//      the forward saved (backward_reference_from_saved), dx at a subset of its columns and dW
//      at a subset of its rows (verification_columns' rule) and every parameter gradient in
//      full, against the sweep's threshold;
//   5. record the winner (a BackwardConfig key) for the problem.
#pragma once
#include <vector>

#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/device.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tune/tuner.hpp"

namespace fusejit {

// Step 1's configs, in the order they are timed; the first is what an untuned plan of p runs
// (plan_backward_config of default_backward_config).
std::vector<BackwardConfig> backward_tuning_configs(const Problem& p, const Device& d);
// Their kernel sets: what `fusejit compile --backward --variant all` warms, so a tune on the
// GPU only times (step 3's pair may still compile).
std::vector<KernelSource> backward_tuning_sources(const Problem& p, const Device& d);

// Tunes the backward of `p` on GPU options.device. TunerOptions as for tune(), except:
// include_reference is ignored (cuBLAS has no fused backward to contend), and
// inject_wrong_candidate corrupts dx after the named candidate's verification run. Throws
// InvalidArgument for a problem BackwardPlan refuses, UnsupportedDevice without a GPU, Error
// when no candidate passes verification (nothing is recorded then).
TuneResult tune_backward(const Problem& p, const TunerOptions& options = {});

}  // namespace fusejit
