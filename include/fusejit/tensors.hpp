// The device buffers one run reads and writes. Raw device pointers; element types follow the
// Problem (x, W, y: storage type of dtype; parameters and running stats: param_dtype; saved
// stats: fp32; num_batches_tracked: int64).
#pragma once
#include <cstdint>

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

struct Tensors {
  const void* x = nullptr;      // [M][ldx]
  const void* w = nullptr;      // [N][ldw]  (nn.Linear weight layout)
  void* y = nullptr;            // [M][ldy]
  const void* bias = nullptr;   // [N], required iff Problem::has_bias
  const void* scale = nullptr;  // [N], required iff Problem::has_scale
  const void* gamma = nullptr;  // [N], required iff Problem::has_affine
  const void* beta = nullptr;   // [N], required iff Problem::has_affine
  // eval: required, read. train: optional (null = track_running_stats=False), updated in place.
  void* running_mean = nullptr;  // [N]
  void* running_var = nullptr;   // [N]
  // train: incremented once per run when given; required when momentum is None (cumulative).
  std::int64_t* num_batches_tracked = nullptr;
  // train, optional: batch mean and 1/sqrt(var + eps) of z per feature (what backward needs).
  float* save_mean = nullptr;    // [N]
  float* save_invstd = nullptr;  // [N]
  // Optional (null: not written): what the backward pass needs of the forward, laid out exactly
  // like y ([M][ldy], storage type of dtype, the same alignment) and not overlapping it. With
  // a = x W^T: train c = a - mean_a (the batch mean of each column of a, the same the batch
  // statistics use); eval u = a + bias (a without bias). Every path writes it, the cuBLASLt
  // reference op (Plan::uses_reference) included.
  void* saved = nullptr;  // [M][ldy]
};

}  // namespace fusejit
#pragma GCC visibility pop
