// cuBLASLt-based implementations that fusejit's fused kernels are measured against:
//   BareGemm    - y = x W^T alone in the problem's dtype: the floor a fused op must approach
//                 (what `fusejit bench` reports ratios against).
//   ReferenceOp - the whole op as cuBLASLt GEMM (+ bias epilogue) followed by plain,
//                 obviously-correct scale/BatchNorm kernels (templates/reference/plain_bn.cuh):
//                 a second, independent implementation for checks, and a contender for the
//                 autotuner. Same Tensors and semantics as fusejit::Plan, so callers can swap them.
// Both use the calling thread's current context at construction (device 0's primary context
// when none is current, like Plan) and make it current again in run().
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/problem.hpp"
#include "fusejit/tensors.hpp"

namespace fusejit {

class BareGemm {
 public:
  // Uses M, N, K, dtype, ldx/ldw/ldy and alignment of `problem` (not mode or parameters).
  // fp16/bf16: 16-bit in and out, fp32 compute; fp32: CUBLAS_COMPUTE_32F (strict); tf32:
  // CUBLAS_COMPUTE_32F_FAST_TF32. Picks cuBLASLt's heuristic algorithm and allocates its
  // workspace. Throws InvalidArgument for a bad problem, CudaError when cuBLASLt has no
  // algorithm or fails.
  explicit BareGemm(const Problem& problem, int device = -1);
  ~BareGemm();
  BareGemm(BareGemm&&) noexcept;
  BareGemm& operator=(BareGemm&&) noexcept;

  // y[M][ldy] = x[M][ldx] * W[N][ldw]^T, enqueued on `stream`. Checks the pointers
  // (InvalidArgument "x", "w" or "y"). Not for concurrent use from two threads.
  void run(CUstream stream, const void* x, const void* w, void* y) const;

  const Problem& problem() const;
  std::size_t workspace_size() const;
  // e.g. "cuBLASLt bf16 TN, compute 32F, workspace 0 B (algo 66, tile id 23, ...)": the chosen
  // algorithm as cublasLt.h enum values.
  std::string description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ReferenceOpOptions {
  int device = -1;        // ordinal; -1: the current context's device, else 0
  std::string cache_dir;  // for the plain kernels; empty: DiskCache::default_dir()
  // Allocate a workspace for run(stream, t). False when every run gets a caller workspace
  // (a Plan running this op passes its own).
  bool own_workspace = true;
};

class ReferenceOp {
 public:
  // Validates `problem` (InvalidArgument), sets up the cuBLASLt GEMM (fp32 output: the BN
  // statistics see the unrounded GEMM, like the fused kernels) and loads the plain kernels
  // (compiled once per (dtype, param dtype) through the disk cache).
  explicit ReferenceOp(const Problem& problem, const ReferenceOpOptions& options = {});
  ~ReferenceOp();
  ReferenceOp(ReferenceOp&&) noexcept;
  ReferenceOp& operator=(ReferenceOp&&) noexcept;

  const Problem& problem() const;
  // Checks `t` exactly as Plan::validate does (same InvalidArgument names). Tensors::saved is
  // written when given, as the fused kernels write it.
  void validate(const Tensors& t) const;
  // Bytes of device workspace a run needs (256-byte aligned): cuBLASLt's, the per-column
  // coefficients and G's means, train's chunk statistics and, when y is 16-bit, the fp32 GEMM
  // output ([M][N]).
  std::size_t workspace_size() const;
  // Enqueues the op on `stream`: no allocation or sync. Uses the object's own workspace, so one
  // ReferenceOp must not run on two streams (or threads) at once.
  void run(CUstream stream, const Tensors& t) const;
  // Same in a caller workspace of at least workspace_size() bytes, 256-byte aligned
  // (InvalidArgument "workspace" otherwise): one ReferenceOp may then run on several streams at
  // once, each with its own workspace.
  void run(CUstream stream, const Tensors& t, void* workspace, std::size_t workspace_bytes) const;
  // A run of the first `rows` rows of x, y and saved, 1 (train: 2) <= rows <= M, and rows = M
  // unless runs_fewer_rows() (InvalidArgument "rows" otherwise): the batch statistics are those
  // rows' alone.
  void run(CUstream stream, const Tensors& t, std::int64_t rows, void* workspace,
           std::size_t workspace_bytes) const;

  // Whether run() takes fewer rows than M: true unless cuBLASLt has no algorithm that runs them
  // all (a degenerate shape, e.g. N = 1 with a padded row stride).
  bool runs_fewer_rows() const;
  std::vector<std::string> kernel_names() const;  // "cublasLtMatmul", then the plain kernels
  std::string description() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The generated translation unit of the plain kernels for one (dtype, param dtype): a prelude
// naming T and P, templates/reference/plain_bn.cuh and the extern "C" kernels fj_ref_stats,
// fj_ref_stats_merge, fj_ref_eval_coef and fj_ref_apply. Exposed so it can be compiled without a
// GPU (tests).
KernelSource reference_kernel_source(DType dtype, DType param_dtype);

}  // namespace fusejit
