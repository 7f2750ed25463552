// Which arithmetic a kernel's GEMM uses; Spec::MATH holds one of these. Plain ints (not an enum
// class) so the codegen can write them into the Spec prelude and templates can branch on them
// with `if constexpr` without any header.
#pragma once

namespace fj {

constexpr int kMathSimtFp32 = 0;  // strict fp32: FFMA on the CUDA cores
constexpr int kMathTf32 = 1;      // fp32 storage, tensor cores in tf32 (PyTorch allow_tf32)
constexpr int kMathFp16 = 2;      // fp16 storage and tensor-core inputs, fp32 accumulate
constexpr int kMathBf16 = 3;      // bf16 storage and tensor-core inputs, fp32 accumulate
// fp32 storage, fp32 accuracy on the tensor cores: three tf32 products per step (3xTF32)
constexpr int kMathTf32x3 = 4;

}  // namespace fj
