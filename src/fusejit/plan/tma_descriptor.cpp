#include "fusejit/plan/tma_descriptor.hpp"

#include <cstring>
#include <string>

#include "common/tma_store_box.h"

#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"

namespace fusejit {

namespace {

CUtensorMapDataType tma_type(DType d) {
  switch (d) {
    case DType::bf16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::fp16:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    // The copy engine rounds to tf32 (nearest) as it loads; raw fp32 bits would make wgmma
    // truncate the low mantissa bits instead, which biases every product toward zero.
    case DType::tf32:
      return CU_TENSOR_MAP_DATA_TYPE_TFLOAT32;
    // 3xTF32 splits the raw fp32 values itself: the copy engine must not round them.
    case DType::fp32:
    case DType::tf32x3:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  }
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

}  // namespace

CUtensorMap encode_tma_tile_map(DType dtype, const void* base, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, int box_rows, int box_cols, const char* what) {
  const auto elem = static_cast<std::int64_t>(storage_bytes(dtype));
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  if (base == nullptr) throw InvalidArgument(what, "is null");
  if (address % 16 != 0) throw InvalidArgument(what, "TMA needs a 16-byte aligned base address");
  if ((ld * elem) % 16 != 0)
    throw InvalidArgument(what, "TMA needs a row stride that is a multiple of 16 bytes; got " +
                                    std::to_string(ld * elem) + " bytes");
  if (rows < 1 || cols < 1 || rows > (std::int64_t{1} << 32) || cols > (std::int64_t{1} << 32))
    throw InvalidArgument(what, "TMA dimensions must lie in [1, 2^32]");
  if (ld < cols || ld * elem >= (std::int64_t{1} << 40))
    throw InvalidArgument(what, "row stride must cover the row and stay below 2^40 bytes");
  const std::int64_t box_bytes = box_cols * elem;
  if ((box_bytes != 128 && box_bytes != 64) || box_rows < 1 || box_rows > 256)
    throw InvalidArgument(what, "TMA box must be 128 or 64 bytes wide and 1..256 rows tall");

  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  // TMA lists dimensions innermost first; the outermost stride is implied.
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * elem)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  // Operand tiles are re-read by the CTAs that share their rows or columns: promote to L2 in
  // 256-byte lines, the granularity those CTAs' boxes share.
  FJ_CU(cuTensorMapEncodeTiled(
      &map, tma_type(dtype), 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

WarpspecTensorMaps warpspec_tensor_maps(const Problem& problem, const KernelConfig& config,
                                        std::int64_t rows, const void* x, const void* w,
                                        const void* y) {
  if (config.variant != Variant::warpspec)
    throw InvalidArgument("config", "tensor maps exist only for the warpspec variant");
  if (config.cluster_m < 1 || config.bn % config.cluster_m != 0)
    throw InvalidArgument("config", "bn must split evenly over the cluster");
  const int atom = static_cast<int>(128 / storage_bytes(problem.dtype));
  WarpspecTensorMaps maps;
  maps.x =
      encode_tma_tile_map(problem.dtype, x, rows, problem.K, problem.lda_x(), config.bm, atom, "x");
  maps.w = encode_tma_tile_map(problem.dtype, w, problem.N, problem.K, problem.lda_w(),
                               config.bn / config.cluster_m, atom, "w");
  std::memset(&maps.y, 0, sizeof(maps.y));
  if (config.tma_store)
    maps.y = encode_tma_store_map(problem.dtype, y, rows, problem.N, problem.lda_y(), "y");
  return maps;
}

CUtensorMap encode_tma_store_map(DType dtype, const void* base, std::int64_t rows,
                                 std::int64_t cols, std::int64_t ld, const char* what) {
  const DType stored = storage_type(dtype);
  return encode_tma_tile_map(stored, base, rows, cols, ld, fj::kTmaStoreBoxRows,
                             fj::kTmaStoreBoxRowBytes / static_cast<int>(storage_bytes(stored)),
                             what);
}

}  // namespace fusejit
