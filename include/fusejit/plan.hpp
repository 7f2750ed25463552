// Plan/run split in the manner of cuBLASLt and cuFFT: everything expensive (validation, config
// choice, codegen, compile or cache lookup, module load) happens when the plan is made; run()
// only checks pointers and enqueues kernels.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/kernel_config.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tensors.hpp"

// NCCL's communicator, as nccl.h declares it (`typedef struct ncclComm* ncclComm_t`): an
// ncclComm_t converts to ncclComm* as it is, and this header needs no NCCL to compile.
struct ncclComm;

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

// True when the environment says FUSEJIT_AUTOTUNE=1 (or true/on/yes): PlanOptions::autotune's
// default.
bool autotune_from_env();

struct PlanOptions {
  int device = -1;  // ordinal; -1: the current context's device, else 0
  // Force a variant or a whole config (testing, benchmarking); otherwise the planner chooses:
  // tuning database exact entry -> nearest tuned bucket -> built-in heuristic (tune/dispatch.hpp).
  std::optional<Variant> variant;
  std::optional<KernelConfig> config;
  std::string cache_dir;  // empty: DiskCache::default_dir() (kernels and tuning/ database)
  // Tune on first sight: a problem without an exact tuning-database entry is measured on this
  // GPU (seconds, once), recorded, and the winner used.
  bool autotune = autotune_from_env();
  // False: ignore the tuning database and take the dispatch's last step only: the fused
  // kernels of default_config(), or for large strict-fp32 problems the reference op
  // (tune/dispatch.hpp, heuristic_prefers_reference).
  bool use_tuning_db = true;
  // Bounds of the caches a plan fills (0: the environment's FUSEJIT_CACHE_MAX_BYTES /
  // FUSEJIT_MAX_KERNEL_SETS, else the defaults 2 GiB and 256). The disk cache evicts its least
  // recently used entries past cache_max_bytes when it stores one; the process keeps at most
  // max_kernel_sets loaded kernel sets not used by a live Plan (least recently used dropped
  // first). Both caches are shared, so the last plan to set a bound sets it for all.
  std::uint64_t cache_max_bytes = 0;
  std::size_t max_kernel_sets = 0;
  // False: the plan allocates no workspace of its own; every run() must then be given one
  // (workspace_size() bytes). Planning then allocates nothing, which is what makes a plan whose
  // kernels are loaded cost microseconds (cuMemAlloc costs tens).
  bool allocate_workspace = true;
  // Required exactly when problem.stat_ranks > 0: the caller's NCCL communicator (an
  // ncclComm_t) of problem.stat_ranks ranks, this process's GPU among them. The caller owns it;
  // it must outlive the plan. run() enqueues one ncclAllGather of the per-column statistics
  // (N x 8 bytes + 16 per rank) on its stream, between the GEMM and the apply pass: no host
  // sync, capturable in a CUDA graph. Every rank must run its plans in the same order, as
  // with any NCCL collective. NCCL is loaded when the first such plan is made (libnccl.so.2,
  // the process's own if it has one); a fusejit built without nccl.h refuses the option.
  ::ncclComm* stats_comm = nullptr;
};

struct PlanCore;  // compiled + loaded kernels, shared by every plan of the same kernel set
class ReferenceOp;

class Plan {
 public:
  // Validates `problem` (InvalidArgument), picks a config, compiles or loads its kernels.
  // Plans whose problems differ only in M share one compiled kernel set when their configs
  // agree (the dispatch picks one config per M range, see README "Variable batch sizes"), cached
  // in-process (thread-safe): a new M then costs no compile.
  explicit Plan(const Problem& problem, const PlanOptions& options = {});
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;

  const Problem& problem() const;
  const KernelConfig& config() const;
  // Bytes of device workspace one run needs (0 when it needs none), 256-byte aligned.
  std::size_t workspace_size() const;

  // Enqueues the op on `stream`. No allocation, host sync, compile or file I/O. Uses the
  // plan's own workspace (allocated when the plan was made, unless allocate_workspace was
  // false), so one Plan must not run on two streams at once; give each stream its own Plan or
  // its own workspace. `stream` is one of the plan's context (the null, legacy and per-thread
  // handles name that context's); the calling thread's current context is as it was when run
  // returns. y and saved must share no byte with x, W, each other or the workspace, nor x or W
  // with the workspace (column slices of one buffer with one row stride are fine):
  // InvalidArgument names the argument.
  void run(CUstream stream, const Tensors& t) const;
  // Same with a caller workspace of at least workspace_size() bytes, 256-byte aligned.
  void run(CUstream stream, const Tensors& t, void* workspace, std::size_t workspace_bytes) const;

  // Variable batches: runs the first `rows` rows of x and y (1 <= rows <= problem().M; train
  // needs rows >= 2) with this plan's kernels, so a plan made for the largest batch serves
  // every smaller one with no compile and no new plan. Batch statistics, running stats and
  // num_batches_tracked are those of the `rows` rows, exactly as a plan made for M = rows.
  // With problem().stat_ranks > 0 the statistics are the global batch's and a rank may run
  // 0 <= rows <= M (an empty rank still takes part in the exchange and updates its running
  // stats); a global batch of fewer than 2 rows leaves NaN in running_var (0/0, the unbiased
  // variance of one value), as the kernels cannot raise an error after the exchange.
  void run(CUstream stream, const Tensors& t, std::int64_t rows) const;
  void run(CUstream stream, const Tensors& t, std::int64_t rows, void* workspace,
           std::size_t workspace_bytes) const;

  // Checks `t` against the problem without launching anything (what run() checks first, with
  // the plan's own workspace, if it has one, as the workspace).
  void validate(const Tensors& t) const;

  // Names of the kernels a run launches, in order (for logs and `fusejit bench`).
  std::vector<std::string> kernel_names() const;
  // Whether this plan found its kernels in a cache (in-process: built for any M of its kernel
  // set; or on disk) and what compiling them cost this plan (0 when it found them).
  bool cache_hit() const;
  double compile_seconds() const;

  // How the config was chosen: "config" or "variant" (forced by PlanOptions), "tuned" (exact
  // tuning-database entry), "m-class" (the entry of the same layer and M class), "bucket"
  // (nearest tuned problem), "autotuned" (measured just now) or "heuristic".
  const std::string& dispatch() const;
  // True when tuning found the cuBLASLt reference op (ReferenceOp) fastest for this problem on
  // this GPU (or, without a tuning entry, the heuristic prefers it): run() then runs it
  // (kernel_names() lists its kernels; for 16-bit y its workspace holds an fp32 [M][N] copy of
  // the GEMM output). It serves every run, Tensors::saved and fewer rows than M included (but
  // for degenerate shapes where cuBLASLt has no algorithm for fewer rows, e.g. N = 1 with a
  // padded row stride: those runs take config()).
  // config() is still the fastest fused config that passed verification (or the heuristic's),
  // which the plan runs instead if cuBLASLt cannot be set up for the problem.
  bool uses_reference() const;

 private:
  struct RunState;  // the problem, workspace layout, launch shape and tensor-map cache
  std::shared_ptr<const PlanCore> core_;
  std::unique_ptr<RunState> state_;
  CUdeviceptr own_workspace_ = 0;
  std::shared_ptr<const ReferenceOp> reference_;
  std::string dispatch_;
};

}  // namespace fusejit
#pragma GCC visibility pop
