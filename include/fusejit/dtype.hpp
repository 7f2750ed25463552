// Element types and modes, with the spellings used on the command line and in keys.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

// The op's math precision. tf32 stores fp32 and multiplies in TF32 (opt-in, like PyTorch's
// allow_tf32); fp32 is strict fp32 (SIMT FFMA). tf32x3 stores fp32 and keeps fp32's accuracy on
// the tensor cores: each operand is split into a TF32 part and the TF32 rounding of what that
// part misses, and three TF32 products (big*big + big*small + small*big) are summed ("3xTF32").
// Accumulation is fp32 for all of them.
enum class DType { fp32, tf32, fp16, bf16, tf32x3 };
enum class Mode { train, eval };

std::string_view name(DType);
std::string_view name(Mode);
DType parse_dtype(std::string_view);  // throws InvalidArgument("dtype", ...)
Mode parse_mode(std::string_view);    // throws InvalidArgument("mode", ...)

// Bytes of one stored element (tf32 and tf32x3 are stored as fp32).
std::size_t storage_bytes(DType);
// The storage type's own name: tf32, tf32x3 -> fp32.
DType storage_type(DType);
// The templates' C++ type for the storage type (templates/common/types.cuh): float, fj::half_t
// or fj::bf16_t. What generated kernel sources write for a Spec's T and P.
const char* template_type_name(DType);

}  // namespace fusejit
#pragma GCC visibility pop
