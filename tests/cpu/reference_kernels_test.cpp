// The reference op's plain BatchNorm kernels (templates/reference/plain_bn.cuh) compile with
// NVRTC for every (dtype, param dtype) the op supports, without a GPU.
#include <doctest/doctest.h>

#include <string>

#include "fusejit/compile/compiler.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"

using namespace fusejit;

TEST_CASE("reference kernels compile for sm_80 and sm_90a for every type pair") {
  for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
    for (DType p : {DType::fp32, storage_type(d)}) {
      CAPTURE(name(d));
      CAPTURE(name(p));
      const KernelSource src = reference_kernel_source(d, p);
      CHECK(src.kernels == std::vector<std::string>{"fj_ref_stats", "fj_ref_stats_merge",
                                                    "fj_ref_eval_coef", "fj_ref_apply"});
      for (const auto& k : src.kernels) CHECK(src.text.find(k) != std::string::npos);
      // Only its own headers: unrelated template edits must not change its cache key.
      for (const auto& [hname, text] : src.headers)
        CHECK((hname == "common/types.cuh" || hname.rfind("reference/", 0) == 0));
      for (const char* arch : {"sm_80", "sm_90a"}) {
        CAPTURE(arch);
        CompiledKernel k;
        REQUIRE_NOTHROW(k = compile(src, arch));
        CHECK(!k.binary.empty());
      }
    }
  }
  // tf32 stores fp32: the same kernels (and cache entry) as fp32.
  CHECK(reference_kernel_source(DType::tf32, DType::fp32).text ==
        reference_kernel_source(DType::fp32, DType::fp32).text);
  CHECK(reference_kernel_source(DType::bf16, DType::fp32).text !=
        reference_kernel_source(DType::bf16, DType::bf16).text);
}
