// The backward pass of the layer: every gradient (dx, dW, dbias, dscale, dgamma, dbeta) from dy
// and what the forward saved. Plan/run split like Plan: BackwardPlan does the expensive work
// (validation, config, codegen, compile or cache lookup, module load) once; run() checks
// pointers and enqueues kernels, with no allocation, host sync, compile or file I/O.
//
// What the forward must have saved: Tensors::saved (the forward's `saved` output, laid out like
// y) and, in train mode, save_mean and save_invstd. Eval backward (fine-tuning with frozen
// statistics) reads the running stats the forward used instead.
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

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

struct BackwardTensors {
  const void* dy = nullptr;     // [M][ldy], storage type: the gradient of y
  const void* x = nullptr;      // [M][ldx]: the forward's x (needed for dw)
  const void* w = nullptr;      // [N][ldw]: the forward's W (needed for dx)
  const void* saved = nullptr;  // [M][ldy]: the forward's Tensors::saved output
  const void* scale = nullptr;  // [N] param dtype, required iff Problem::has_scale
  const void* gamma = nullptr;  // [N] param dtype, required iff Problem::has_affine
  // eval: required, the running stats the forward normalized with. train: must be null.
  const void* running_mean = nullptr;
  const void* running_var = nullptr;
  // train: required, the forward's saved statistics (save_mean is checked but not read: saved
  // holds a - mean already). eval: must be null.
  const float* save_mean = nullptr;
  const float* save_invstd = nullptr;
  // Outputs. Each may be null: that gradient is not computed (dx: the first layer; the
  // parameter gradients: a frozen layer). A parameter gradient must be null when the problem
  // has no such parameter. dx's address range, [dx, dx + ((rows - 1) ldx + K) elements), must
  // not meet W's (nor x's where dw is wanted), dw's not x's (nor W's or dx's where dx is wanted),
  // and neither the workspace's: the gradient GEMMs read x, W and da while they write
  // (InvalidArgument "dx" / "dw"). The parameter gradients are not checked against the other
  // tensors.
  void* dx = nullptr;      // [M][ldx], storage type
  void* dw = nullptr;      // [N][ldw], storage type
  void* dbias = nullptr;   // [N], param dtype
  void* dscale = nullptr;  // [N], param dtype
  void* dgamma = nullptr;  // [N], param dtype
  void* dbeta = nullptr;   // [N], param dtype
};

struct BackwardOptions {
  int device = -1;        // ordinal; -1: the current context's device, else 0
  std::string cache_dir;  // empty: the default kernel cache
  // True: dw and the parameter gradients are added to what their buffers hold (dW += da^T x),
  // as frameworks accumulate .grad; dx is always overwritten. The same tiles either way: dW
  // then takes its thread-store epilogue (it reads what the buffer holds) even where the tiles'
  // key asks for TMA stores, and `fusejit autotune --backward` ranks tiles without accumulation.
  bool accumulate = false;
  // False: the plan allocates no workspace; every run() must be given one (workspace_size()).
  bool allocate_workspace = true;
  // Force the tiles of the gradient GEMMs (testing, benchmarking): tiled configs, or on Hopper
  // for bf16, fp16 and tf32 warpspec ones without clusters, pingpong or .pad, at any alignment
  // (rows TMA cannot load are read from padded copies); TMA stores (.ts) need K x element size a
  // multiple of 16 and 16-byte aligned rows; split-K up to 32, not with .ts; never exact_m
  // (InvalidArgument "dx_config" / "dw_config" otherwise).
  // dx = da W is an M x K GEMM reducing over N; dW = da^T x an N x K GEMM reducing over the
  // run's M. Unset: the tuning database's backward entry for the layer's M class (`fusejit
  // autotune --backward`), else the heuristic (warpspec where it can run; cuBLASLt for strict
  // fp32 and tf32x3, and for 16-bit GEMMs of 16-byte aligned rows whose tiles would be one wave
  // of single consumers over a long reduction, a split dW, or a grid leaving many SMs idle in a
  // partial wave: docs/design.md, "Gradient GEMMs on cuBLASLt").
  std::optional<KernelConfig> dx_config, dw_config;
  // Force that GEMM onto cuBLASLt instead (reading da from the workspace and the layer's x and W
  // in place, any layout): what strict fp32 and tf32x3 layers (and some 16-bit GEMMs, above)
  // run without a tuning entry, and a contender `fusejit autotune --backward` times for every
  // dtype. Not with the same GEMM's
  // *_config (InvalidArgument "dx_cublaslt" / "dw_cublaslt").
  bool dx_cublaslt = false, dw_cublaslt = false;
};

struct BackwardCore;

class BackwardPlan {
 public:
  // Validates `problem` (InvalidArgument), picks the kernels' tiles, compiles or loads them.
  // Plans differing only in M share one compiled kernel set where their tiles agree (the
  // dispatch picks them per M class); a GEMM on cuBLASLt is set up per plan (its algorithm
  // chosen for the plan's M). Without a tuning entry for its own M or a forced dx, a plan whose
  // own M leaves many of the class's dX tiles' SM slots idle runs dX on cuBLASLt instead, on the
  // same kernel set (config_key() then says dx.cublaslt; run() may then throw CudaError for a
  // row count cuBLASLt refuses, as below).
  explicit BackwardPlan(const Problem& problem, const BackwardOptions& options = {});
  ~BackwardPlan();
  BackwardPlan(BackwardPlan&&) noexcept;
  BackwardPlan& operator=(BackwardPlan&&) noexcept;

  const Problem& problem() const;
  // Bytes of device workspace a run of up to problem().M rows needs, 256-byte aligned. It
  // holds da ([M][N], storage type, rows padded to 16 bytes), the column partials and, where the
  // gradient GEMMs need them, split slices, operand copies or cuBLASLt's workspace.
  std::size_t workspace_size() const;
  // "dx.<config key>.dw.<config key>": the two GEMMs' tiles ("cublaslt" for one on cuBLASLt).
  std::string config_key() const;
  std::vector<std::string> kernel_names() const;
  // Whether this plan found its kernels in a cache (in-process: built for another plan of the
  // same kernel set; or on disk), as Plan::cache_hit.
  bool cache_hit() const;
  // How the tiles were chosen: "config" (BackwardOptions forced dx_config, dw_config,
  // dx_cublaslt or dw_cublaslt; with one GEMM forced, the other's come from the steps that
  // follow), "tuned" (the tuning database's backward entry for the problem, `fusejit autotune
  // --backward`), "m-class" (its layer's entry for another M of the same M class) or
  // "heuristic" (also where cuBLASLt declined the dispatch's choice: the heuristic's tiles).
  const std::string& dispatch() const;

  // Enqueues the backward of the first `rows` rows (1 <= rows <= problem().M; train needs
  // rows >= 2) on `stream`: the rows the forward ran, whose batch `saved` and save_invstd
  // describe (other rows give wrong gradients, which no check can see). The plan's own
  // workspace, or the caller's (workspace_size() bytes, 256-byte aligned). A workspace serves
  // one run at a time: one BackwardPlan must not run on two streams at once with its own
  // workspace; give each stream its own plan or its own workspace. A gradient GEMM on cuBLASLt
  // is asked about a row count it was not checked at when the plan was made (once per count,
  // on the host); a count it refuses throws CudaError before anything is enqueued. After an
  // exception from a run that had started (a CudaError from a launch), the gradients it was to
  // write are undefined, accumulated ones included. Streams and the current context as
  // Plan::run. dx and dW must not meet the workspace, each other, or an operand a GEMM of the
  // run reads (W for dx, x for dW; x too for dx and W too for dW when both are wanted), nor dy,
  // saved, or a read x or W the workspace (dx may overwrite dy or saved).
  void run(CUstream stream, const BackwardTensors& t) const;
  void run(CUstream stream, const BackwardTensors& t, std::int64_t rows) const;
  void run(CUstream stream, const BackwardTensors& t, std::int64_t rows, void* workspace,
           std::size_t workspace_bytes) const;

  // What run() checks first, without launching anything, for a run of all problem().M rows
  // (the overlaps are of the run's rows: a run of fewer may pass where this does not) with the
  // plan's own workspace, if it has one.
  void validate(const BackwardTensors& t) const;

 private:
  struct RunState;  // what runs remember between calls (the last stream checked)
  std::shared_ptr<const BackwardCore> core_;
  std::unique_ptr<RunState> state_;
  Problem problem_;
  bool accumulate_ = false;
  CUdeviceptr own_workspace_ = 0;
  std::string dispatch_;
};

}  // namespace fusejit
#pragma GCC visibility pop
