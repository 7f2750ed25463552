// The backward pass's kernel set: (Problem, BackwardConfig) -> KernelSource. Same rules as the
// forward's (codegen.hpp): a generated prelude of constexpr values, the templates included, the
// extern "C" kernels; M is a run-time value, so one set serves every batch size of a layer.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/kernel_config.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// The two gradient GEMMs' tiles: the tiled variant (mma.sync, or FFMA for strict fp32) or, on
// Hopper for bf16/fp16, the warpspec one (TMA + wgmma, kernels/grad_wgmma.cuh: no clusters or
// pingpong); either may split K (fp32 slices in the workspace, then an elementwise sum kernel:
// kernels/grad_split_sum.cuh); no exact M. dx = da W (M x K, reduction over N), dW = da^T x
// (N x K, reduction over the run's M).
// The key of a gradient GEMM that runs on cuBLASLt (BackwardConfig::dx_cublaslt, dw_cublaslt).
inline constexpr std::string_view kCublasLtGemmKey = "cublaslt";

struct BackwardConfig {
  KernelConfig dx, dw;
  // That GEMM runs on cuBLASLt (plan/backward_core.hpp, BackwardLt) from da in the workspace,
  // instead of a kernel of this set; its KernelConfig is then unused and left default. On strict
  // fp32's FFMA tiles the backward took 1.15-4.6x its two SGEMMs (docs/performance.md).
  bool dx_cublaslt = false, dw_cublaslt = false;
  // "dx.<key>.dw.<key>": every field of both (kCublasLtGemmKey for a GEMM on cuBLASLt), for
  // source names, caches, logs and the tuning database.
  std::string key() const;
  // One GEMM's part of key(): its tiles' key, or kCublasLtGemmKey.
  std::string dx_key() const;
  std::string dw_key() const;
  // The inverse of key(). Throws InvalidArgument(arg, ...) for text that is not one.
  static BackwardConfig parse(std::string_view key, const char* arg = "backward-config");
};

// kernels/grad_wgmma.cuh's dynamic shared memory for a warpspec config of the GEMMs' dtype
// (grad_gemm_dtype: ring, barriers, TMA store boxes, alignment slack); the generated Spec passes
// it as SMEM_BYTES, which the template checks against sizeof(SharedStorage).
int grad_wgmma_smem_bytes(const KernelConfig&, DType);

// Whether a warpspec gradient GEMM of this config reads its B operand (dX: W, dW: x) from a
// K-major copy the backward run makes first (kernels/transpose.cuh: W^T, x^T) rather than in
// place with TMA: always for tf32, since wgmma has no MN-major tf32 operands, and for 16-bit
// types whose one alignment promise (Problem::effective_alignment: x's, W's and y's rows and
// pointers) is below TMA's 16 bytes, since the copies' rows are padded (grad_row_elements).
bool grad_gemm_reads_copies(const Problem&, const KernelConfig&);
// The same for the layer alone: whether its warpspec gradient GEMMs would read those copies.
bool grad_gemm_layer_reads_copies(const Problem&);
// Whether dW's A is a K-major copy dA^T too (tf32 reading copies); 16-bit types read dA in place
// through wgmma's transpose bits.
bool grad_gemm_reads_da_copy(const Problem&, const KernelConfig&);

// A row of `elements` of the layer's storage type rounded up to 16 bytes: the row stride, in
// elements, of da in the workspace (grad_da_row_elements) and of the copies above, which TMA
// loads from.
std::int64_t grad_row_elements(std::int64_t elements, DType);
// da's row stride in the workspace: N padded to 16 bytes, so that TMA loads da and its rows take
// 16-byte copies whatever N is.
std::int64_t grad_da_row_elements(const Problem&);

// The tiled gradient GEMMs' copy widths in bytes, each the widest its rows allow, at most 16
// (their Specs' A_VEC_BYTES <- da; B_VEC_BYTES and VEC_BYTES <- layer). `da`: A of both GEMMs,
// [M][grad_da_row_elements] in the workspace, 16. `layer`: their B (W, x) and C (dx, dW), the
// caller's tensors, whose one promise (Problem::effective_alignment) also covers y's rows.
struct GradGemmVecBytes {
  int da;
  int layer;
};
GradGemmVecBytes grad_gemm_vec_bytes(const Problem&);

// The GEMMs as forward-shaped problems (C = A B^T is M x N with reduction K): what the config
// rules (KernelConfig::why_invalid, default_config) are asked about, and whose dtype is the
// GEMMs' math (tf32x3's is strict fp32: grad_gemm_dtype). dW's reduction is the problem's M,
// its largest batch.
DType grad_gemm_dtype(DType);
Problem dx_gemm_problem(const Problem&);
Problem dw_gemm_problem(const Problem&);

// Kernels of the set, in launch order: fj_bwd_reduce, then fj_bwd_coef, fj_bwd_da (train) or
// fj_bwd_params (eval), [fj_bwd_transpose] (grad_gemm_reads_copies), fj_bwd_dx, [fj_bwd_dx_sum] (dx
// split), fj_bwd_dw, [fj_bwd_dw_sum] (dW split). Train's set also has fj_bwd_resident and
// fj_bwd_resident_shared, one of which a run that forms da launches instead of the three passes
// (the second where its blocks have several units and slabs short enough to hold the first in
// shared memory); the passes run where the driver refuses the cooperative launch
// (plan/backward_core.cpp).
std::vector<std::string> backward_kernel_set(const Problem&, const BackwardConfig&);

// The source. It names no M: problems differing only in M give the same text (one cache key).
KernelSource generate_backward(const Problem&, const BackwardConfig&);

}  // namespace fusejit
