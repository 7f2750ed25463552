// Host side of the warpspec kernel's TMA copies: the tensor maps (CUtensorMap, passed by value
// as the kernel's fj::TmaDescriptor parameters) through which its producer copies x and W tiles
// into shared memory and, with tma_store, its consumer warps copy y out. Encoding is a pure
// host call (no device work), cheap enough to redo on every run, which is how a run picks up
// new tensor addresses.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "fusejit/config/candidates.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// A row-major [rows][cols] matrix with a row stride of `ld` elements of `dtype`'s storage type,
// copied in boxes of `box_rows` rows x `box_cols` columns, swizzled in shared memory with the
// pattern of the box's row width (box_cols elements must span exactly 128 or 64 bytes: one
// swizzle row). Loads read elements past `rows` or `cols` as zero; stores skip them. tf32 maps
// round fp32 to tf32 on the way in, as the tensor cores expect.
// Throws InvalidArgument(`what`, ...) when the base address or the row stride is not 16-byte
// aligned, or a dimension is out of TMA's range; CudaError when the driver rejects the map.
CUtensorMap encode_tma_tile_map(DType dtype, const void* base, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, int box_rows, int box_cols, const char* what);

// The map of the per-warp TMA stores (epilogue/warp_box_store.cuh) into a row-major [rows][cols]
// matrix of `dtype`'s values: boxes of fj::kTmaStoreBoxRows rows x fj::kTmaStoreBoxRowBytes, in
// the storage type (tf32's TFLOAT32 would name the loads' rounding, which stored fp32 values must
// not get). y of the forward, dX and dW of the gradient GEMMs.
CUtensorMap encode_tma_store_map(DType dtype, const void* base, std::int64_t rows,
                                 std::int64_t cols, std::int64_t ld, const char* what);

struct WarpspecTensorMaps {
  CUtensorMap x;  // [M][K] boxes of bm rows
  CUtensorMap w;  // [N][K] boxes of bn / cluster_m rows (each CTA of a cluster loads its half)
  CUtensorMap y;  // tma_store: [M][N], encode_tma_store_map; else zeros
};

// The maps the warpspec kernel of `config` expects for `problem` with these operands and a run
// of `rows` rows (x and y are [rows][...]; loads past them read zero, stores skip them): boxes
// of one 128-byte K slab (64 bf16/fp16 or 32 tf32 elements) by the CTA's rows, and for y one
// consumer warp's 16 rows by 32 columns.
WarpspecTensorMaps warpspec_tensor_maps(const Problem& problem, const KernelConfig& config,
                                        std::int64_t rows, const void* x, const void* w,
                                        const void* y);

}  // namespace fusejit
