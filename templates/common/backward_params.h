// Kernel parameters of the backward pass's BatchNorm kernels (kernels/bn_backward.cuh), shared
// verbatim by the host (plan/backward_launch) and the generated kernels. Plain C++: no CUDA
// headers.
//
// The math, per column n over the run's m rows (z = s (a + b), a = x W^T, zh = (z - mu) invstd):
//   dbeta = sum dy, dgamma = sum dy zh
//   train: dz = g invstd / m (m dy - dbeta - zh dgamma)      eval: dz = g dy / sqrt(rv + eps)
//   da = s dz, dbias = sum da (train: 0 exactly, written as such), dscale = sum dz (a + b);
//   dx = da W, dW = da^T x.
// What the forward saved (Tensors::saved, laid out like y): train c = a - mean_a (the linear
// output centred by its batch mean: zh = s invstd c, dgamma = s invstd sum dy c, and
// dscale = g eps invstd^3 sum dy c, the closed form of sum dz (a + b), whose terms cancel),
// eval u = a + b (zh = (s u - rm) / sqrt(rv + eps)).
#pragma once

namespace fj {

struct BackwardParams {
  const void* dy;     // [m][LDY], T
  const void* saved;  // [m][LDY], T (see above)
  // Per-feature parameters [N] in Spec::P; null when the problem says they are absent.
  const void* scale;
  const void* gamma;
  // eval: the running stats the forward used [N], P. train: the forward's saved stats [N], fp32.
  const void* running_mean;
  const void* running_var;
  const float* save_mean;
  const float* save_invstd;
  // Parameter gradients [N] in P; each may be null (not wanted).
  void* dbias;
  void* dscale;
  void* dgamma;
  void* dbeta;
  // Workspace: per (slab of slab_rows rows, column) partial sums, written in a fixed order and
  // merged in a fixed order (no atomics: the gradients are the same on every run).
  float* ws_dy_partials;  // [slabs][N] x {sum dy, sum dy c} (train) or {sum dy, sum dy zh} (eval)
  float* ws_dz_partials;  // eval: [slabs][N] x {sum dz, sum dz u}
  float* ws_coef;         // train: [N] x da's {A, B, C, 0} (kernels/bn_backward.cuh, backward_da)
  // train, fj_bwd_resident: per strip, the column blocks whose coefficients are in ws_coef
  // (zeroed by the kernel itself before its grid barrier).
  unsigned* ws_strip_ready;
  void* ws_da;    // [m][Spec::LDDA], T: da, the operand of both gradient GEMMs; null: not needed
  int m;          // rows of this run
  int slabs;      // ceil(m / slab_rows): the host's split (backward_slabs)
  int slab_rows;  // a multiple of kBackwardRowThreads
  float eps;
  int accumulate;  // != 0: the parameter gradients are added to what their buffers hold
};

}  // namespace fj
