// One cuBLASLt matmul set up once and enqueued many times: the matmul descriptor, the operand
// layouts and the heuristic's algorithm for a shape. The forward's baseline and reference op
// (reference/cublaslt_reference.hpp) and the backward's gradient GEMMs on cuBLASLt
// (plan/backward_core.hpp) all run through it.
//
// Column-major throughout, as cuBLASLt is: D (m x n, ld ldd) = op(A) op(B) [+ D], op(A) m x k,
// op(B) k x n. A row-major matrix [r][ld] is the column-major (cols x r, ld) one, so callers
// describe their row-major GEMMs transposed.
#pragma once
#include <cublasLt.h>
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fusejit/dtype.hpp"

namespace fusejit {

// Throws CudaError naming `what` and cuBLASLt's status unless `s` is success.
void check_lt(cublasStatus_t s, const char* what);

struct LtHandleDeleter {
  void operator()(cublasLtContext* h) const;
};
using LtHandle = std::unique_ptr<cublasLtContext, LtHandleDeleter>;
LtHandle make_lt_handle();

// The storage type of a fusejit dtype as cuBLASLt names it, and its name in messages.
cudaDataType_t lt_type(DType);
const char* lt_type_name(cudaDataType_t);
// Strict fp32 for fp32 (PyTorch's default, no TF32 anywhere); TF32 where the dtype opts in.
cublasComputeType_t lt_compute(DType);

struct LtGemmSpec {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t ab_type = CUDA_R_32F, d_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  // The byte alignment every run's A and B (ab) and D (d) pointers and leading dimensions keep.
  unsigned ab_alignment = 16, d_alignment = 16;
  // Bias epilogue (D's type, one value per row of D). Its pointer is set per run; the heuristic
  // derives the alignment it may assume from the pointer it is shown, so it is shown a 16-byte
  // (not 32-byte) aligned dummy and such runs only use this GEMM with 16-byte aligned biases.
  bool bias_epilogue = false;
};

class LtGemm {
 public:
  static constexpr std::uintptr_t kBiasAlignmentHint = 16;
  // What cuBLASLt's documentation recommends for Hopper; older GPUs need less, and the heuristic
  // reports how much the chosen algorithm really uses (workspace()).
  static constexpr std::size_t kMaxWorkspace = std::size_t{32} << 20;

  // Null when cuBLASLt has no algorithm for `s`.
  static std::unique_ptr<LtGemm> make(cublasLtHandle_t, const LtGemmSpec& s);
  // make(), or CudaError naming the shape when cuBLASLt has no algorithm for it.
  static std::unique_ptr<LtGemm> require(cublasLtHandle_t, const LtGemmSpec& s);
  // For GEMMs whose n or k (never m) is a run's row count, any count from `least` to the spec's:
  // the heuristic's best algorithm for the spec's shape that cuBLASLt also accepts at `least`,
  // each power of two, the midpoint and the spec's count - 1, so that a run of fewer rows keeps
  // the one algorithm (run() checks the rest as cuBLASLt does). Null when none of its
  // candidates does.
  static std::unique_ptr<LtGemm> make_for_rows(cublasLtHandle_t, const LtGemmSpec& s,
                                               bool rows_are_n, std::int64_t least);
  // make_for_rows(), or CudaError naming the shape and the row range.
  static std::unique_ptr<LtGemm> require_for_rows(cublasLtHandle_t, const LtGemmSpec& s,
                                                  bool rows_are_n, std::int64_t least);
  // Whether run() of `rows` rows keeps the algorithm within `ws_bytes` of workspace (the same
  // `ws_bytes` on every call: what the caller's runs pass to run()): the counts make_for_rows
  // checked, or cublasLtMatmulAlgoCheck at this one, remembered once accepted (counts up to
  // kRememberedRows; larger ones are asked every call). Host only: no GPU work, and no
  // allocation of fusejit's (what cublasLtMatmulAlgoCheck does inside is cuBLASLt's); thread-safe.
  // A GEMM from make() runs only its own count.
  bool runs_rows(cublasLtHandle_t, std::int64_t rows, std::size_t ws_bytes) const;
  // The largest row count runs_rows remembers: a bit each, 512 KiB at most per GEMM.
  static constexpr std::int64_t kRememberedRows = std::int64_t{1} << 22;
  ~LtGemm();

  std::size_t workspace() const { return workspace_; }
  const LtGemmSpec& spec() const { return spec_; }
  // What the heuristic chose, as cublasLt.h's enum values (tile, stages and cluster ids), so a
  // benchmark says which cuBLASLt kernel it ran.
  std::string algo_summary() const;

  // D := op(A) op(B) (+ bias) (+ D when `accumulate`) on `stream`. `bias` must be given iff the
  // spec has the bias epilogue. `rows` >= 0 replaces n or k (require_for_rows' choice) for this
  // run; its layouts (and, with a bias, its descriptor) are built on the stack, so a run
  // allocates nothing and one LtGemm may run on several threads at once.
  void run(cublasLtHandle_t, CUstream stream, const void* a, const void* b, void* d,
           const void* bias, void* ws, std::size_t ws_bytes, bool accumulate = false,
           std::int64_t rows = -1) const;

 private:
  LtGemm() = default;
  void mark_accepted(std::int64_t rows) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LtGemmSpec spec_;
  std::size_t workspace_ = 0;
  bool rows_are_n_ = true;
};

}  // namespace fusejit
