// The float64 verification core: a case (problem, input distribution, tracking) in the
// sweep-file language, its fresh random inputs with poisoned outputs, the float64 reference
// of the same rounded inputs, and the one pass rule. The autotuner verifies every winner
// with it at run time; `fusejit check` and the tests (src/tools/sweep.hpp) run it over sweeps.
//
// Sweep files hold one case per line (blank lines and text after '#' are ignored):
//
//     MxNxK dtype mode [param_dtype] [flag ...]
//
//   dtype        fp32 | tf32 | fp16 | bf16 | tf32x3
//   mode         train | eval
//   param_dtype  fp32 (default) | same | the input's storage type (storage of bias, scale,
//                gamma, beta and the running stats)
//   flags        nobias | noscale | noaffine    the parameter is absent
//                momentum=X | momentum=none     BatchNorm momentum (default 0.1); none: cumulative
//                eps=X                          BatchNorm eps (default 1e-5)
//                ldx=N | ldw=N | ldy=N          row strides in elements (default packed); the
//                                               padding of x and W holds NaN, which must not leak
//                align=B                        promise only B-byte alignment (16, 8, 4, 2, 1;
//                                               default: the widest the strides allow)
//                centred | non_centred          x ~ N(0,1) (default) or U[0,1) (KernelBench)
//                notrack                        train without running stats
//   e.g.  "1000x200x64 bf16 train same noscale momentum=none ldx=72 non_centred"
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/backward.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tensors.hpp"
#include "fusejit/verify/cpu_reference.hpp"
#include "fusejit/verify/host_tensor.hpp"

namespace fusejit {

struct SweepCase {
  Problem problem;  // alignment: what the case's strides allow (or less, with align=)
  Distribution distribution = Distribution::centred;
  bool track_running_stats = true;  // train: pass running_mean/var (eval always does)

  // The case in sweep-file syntax; parse_sweep_line(text()) gives the case back.
  std::string text() const;
};

// The widest alignment the problem's strides allow (cuMemAlloc'ed bases are 256-byte aligned).
int stride_alignment(const Problem& p);
// True for a sweep-file line that holds no case (blank, or only a comment).
bool is_blank_sweep_line(std::string_view line);

// One line of a sweep file. Throws InvalidArgument("sweep", ...) naming the bad token, or the
// InvalidArgument of Problem::validate for a problem that cannot run.
SweepCase parse_sweep_line(std::string_view line);
// Largest relative error a case may show in y, the running stats and the saved stats:
// fp32 2e-5, tf32 2e-3, fp16/bf16 1e-2.
double sweep_threshold(DType dtype);

// ||got - ref|| / ||ref|| (2-norms; ||got - ref|| when ref is all zero); +inf when got holds a
// NaN or inf, or the sizes differ.
double relative_error(const std::vector<double>& got, const std::vector<double>& ref);
// ||got - ref|| / ||scale||: the error measured against each element's natural scale.
double scaled_error(const std::vector<double>& got, const std::vector<double>& ref,
                    const std::vector<double>& scale);

// A case's host inputs in their storage formats: what the GPU is given, bit for bit.
struct CaseInputs {
  SweepCase c;
  std::uint64_t seed = 0;
  HostTensor x, w;                       // [M][ldx], [N][ldw]; padding holds NaN
  HostTensor bias, scale, gamma, beta;   // [N] in param dtype; empty when absent
  HostTensor running_mean, running_var;  // [N]; empty in train without tracking
  std::int64_t num_batches_tracked = 0;  // the counter's value before the run
  bool count_batches() const;  // train with tracking or cumulative momentum: pass the counter
};
// Fresh random inputs (fresh_seed() unless `seed` is given). x per the case's distribution;
// W and bias ~ U(-1/sqrt(K), 1/sqrt(K)) (nn.Linear's init), scale ~ N(0, 1), gamma ~ N(1, 0.25),
// beta ~ N(0, 0.5), running_mean ~ N(0, 0.5), running_var ~ U[0.5, 1.5), counter in [0, 9].
CaseInputs make_case_inputs(const SweepCase& c, std::optional<std::uint64_t> seed = {});
// A fresh x of the same shape and stride (for multi-step tests).
HostTensor make_x(const SweepCase& c, std::uint64_t seed);
// How a tf32 implementation reads its fp32 operands x and W, for the float64 reference to read
// them the same way. fusejit's kernels round them (rounded: round_to_tf32). cuBLASLt's FAST_TF32
// compute type allows tensor cores without requiring them, and its kernels differ: some round
// the operands, some read their top 10 mantissa bits (truncated: truncate_to_tf32), and it may
// pick an fp32 kernel that reads them whole. On an H200 a 3x1x1 tf32 train layer matched the
// whole operands' float64 and missed the rounded ones' by 2.2e-3; a 2x7x8 one matched the
// rounded ones and missed the whole ones' save_invstd by 3.5e-3.
enum class Tf32Operands { rounded, truncated, whole };
std::string_view name(Tf32Operands);
// The readings fusejit's kernels and cuBLASLt's (the reference op) are each judged against.
inline constexpr Tf32Operands kFusedTf32Readings[] = {Tf32Operands::rounded};
inline constexpr Tf32Operands kCublasLtTf32Readings[] = {
    Tf32Operands::rounded, Tf32Operands::truncated, Tf32Operands::whole};
// The inputs as the float64 reference takes them (packed, exactly the rounded values; tf32's x
// and W as `tf32` says; other dtypes ignore it).
ReferenceInputs reference_inputs(const CaseInputs& in, Tf32Operands tf32 = Tf32Operands::rounded);
// The forward's `saved` output (Tensors::saved) in float64, [M][N] packed: with a = x W^T,
// train c = a - (batch mean of a's column), eval u = a + bias. Taken by value: pass
// reference_inputs(...) and nothing is copied.
std::vector<double> reference_saved(ReferenceInputs in, Mode mode, unsigned threads = 0);

// Rows [0, rows) x columns [0, cols) of a row-major [rows][ld] device array of `dtype`'s storage
// type, packed, as doubles (a synchronous copy).
std::vector<double> download_packed(const DeviceBuffer& b, DType dtype, std::int64_t rows,
                                    std::int64_t cols, std::int64_t ld);

// The backward's inputs from a forward run's tensors: x, W, saved, scale and gamma, the
// statistics `mode` reads (eval: the running stats; train: the saved ones), and `dy`. Every
// gradient output is left null.
BackwardTensors backward_inputs(Mode mode, const Tensors& forward, const void* dy);

// What one run produced, decoded to doubles.
struct CaseOutputs {
  std::vector<double> y;                          // [M][N], packed
  std::vector<double> saved;                      // [M][N], packed; empty unless requested
  std::vector<double> running_mean, running_var;  // empty when not passed
  std::vector<double> save_mean, save_invstd;     // train only
  std::int64_t num_batches_tracked = 0;           // when counted
  bool y_padding_intact = true;                   // columns N..ldy-1 of y still hold the poison
  bool saved_padding_intact = true;               // likewise of saved (when requested)
};

// Device buffers for one case: inputs uploaded, y and the saved stats poisoned with NaN.
// `with_saved`: also a `saved` output laid out like y (Tensors::saved), poisoned likewise.
class DeviceCase {
 public:
  explicit DeviceCase(const CaseInputs& in, bool with_saved = false);
  // Uploads every input and running stat again and re-poisons the outputs.
  void reset(const CaseInputs& in);
  void upload_x(const HostTensor& x);
  // Variable batches: x of `rows` rows (same row stride) into the first rows of this case's
  // x, with y and the saved stats poisoned again; download(rows) reads the first rows of y.
  // The running stats and the counter stay as the last run left them.
  void upload_x_rows(const HostTensor& x, std::int64_t rows);
  Tensors tensors() const;
  CaseOutputs download() const { return download(c_.problem.M); }
  CaseOutputs download(std::int64_t rows) const;

 private:
  SweepCase c_;
  bool count_ = false;
  DeviceBuffer x_, w_, y_, bias_, scale_, gamma_, beta_, rm_, rv_, nbt_, save_mean_, save_invstd_;
  DeviceBuffer saved_;  // empty unless asked for
  void poison_outputs();
};

struct CaseErrors {
  // Relative errors (relative_error); 0 for outputs the case does not have.
  double y = 0, running_mean = 0, running_var = 0, save_mean = 0, save_invstd = 0;
  double saved = 0;         // when the outputs hold saved
  bool non_finite = false;  // a NaN or inf where a number was expected
  bool counter_ok = true;   // num_batches_tracked advanced by exactly one (train)
  bool padding_ok = true;   // nothing written past column N of y (or saved)
  bool stats_kept = true;   // eval: the running stats are left exactly as they were
  double worst() const;
};
// `got.saved`, when there, is compared with `ref_saved` (reference_saved; computed here when
// null, from reference_inputs(in): tf32's rounded reading, so a caller judging another reading
// passes its own) by relative error: c is centred, so that is its error against its own spread,
// however large the column's mean.
CaseErrors compare(const CaseInputs& in, const CaseOutputs& got, const ReferenceOutputs& ref,
                   const std::vector<double>* ref_saved = nullptr);

// The pass rule of every verification (the sweep, the tuner): every figure finite and under
// `threshold`, the counter advanced by one, nothing written past column N, eval's running
// stats untouched. `why` (when given) gets what failed, "; "-separated.
bool passes(const CaseErrors& e, double threshold, std::string* why = nullptr);

// `got` against the float64 forward (and `saved`, when got holds it) of each way in `reads` that
// the implementation may have read tf32's operands (other dtypes: the first only): the first
// reading that passes `threshold`, else the one whose worst figure is least. `why` gets
// passes()'s reasons for it, naming the reading when there were several.
struct ReadingErrors {
  CaseErrors errors;
  Tf32Operands reading = Tf32Operands::rounded;
  bool passed = false;
};
ReadingErrors compare_readings(const CaseInputs& in, const CaseOutputs& got,
                               const ReferenceSettings& s, std::span<const Tf32Operands> reads,
                               double threshold, std::string* why = nullptr);

}  // namespace fusejit
