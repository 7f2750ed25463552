// Host side of the warpspec kernel's TMA loads: the two tensor maps (CUtensorMap, passed by
// value as the kernel's fj::TmaDescriptor parameters) through which its producer copies x and
// W tiles into shared memory. Encoding is a pure host call (no device work), cheap enough to
// redo on every run, which is how a run picks up new tensor addresses.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "fusejit/config/kernel_config.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// A row-major [rows][cols] matrix with a row stride of `ld` elements of `dtype`'s storage type,
// read in boxes of `box_rows` rows x `box_cols` columns with 128-byte swizzling (box_cols
// elements must span exactly 128 bytes: one swizzle row). Elements past `rows` or `cols` read
// as zero. tf32 maps round fp32 to tf32 on the way in, as the tensor cores expect.
// Throws InvalidArgument(`what`, ...) when the base address or the row stride is not 16-byte
// aligned, or a dimension is out of TMA's range; CudaError when the driver rejects the map.
CUtensorMap encode_tma_tile_map(DType dtype, const void* base, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, int box_rows, int box_cols, const char* what);

struct WarpspecTensorMaps {
  CUtensorMap x;  // [M][K] boxes of bm rows
  CUtensorMap w;  // [N][K] boxes of bn / cluster_m rows (each CTA of a cluster loads its half)
};

// The maps the warpspec kernel of `config` expects for `problem` with these operands: boxes
// of one 128-byte K slab (64 bf16/fp16 or 32 tf32 elements) by the CTA's rows.
WarpspecTensorMaps warpspec_tensor_maps(const Problem& problem, const KernelConfig& config,
                                        const void* x, const void* w);

}  // namespace fusejit
