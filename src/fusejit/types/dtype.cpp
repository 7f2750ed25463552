#include "fusejit/dtype.hpp"

#include "fusejit/error.hpp"

namespace fusejit {

std::string_view name(DType d) {
  switch (d) {
    case DType::fp32:
      return "fp32";
    case DType::tf32:
      return "tf32";
    case DType::fp16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    case DType::tf32x3:
      return "tf32x3";
  }
  return "?";
}

std::string_view name(Mode m) {
  return m == Mode::train ? "train" : "eval";
}

DType parse_dtype(std::string_view s) {
  for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16, DType::tf32x3})
    if (s == name(d)) return d;
  throw InvalidArgument(
      "dtype", "expected one of fp32, tf32, fp16, bf16, tf32x3; got '" + printable(s) + "'");
}

Mode parse_mode(std::string_view s) {
  if (s == "train") return Mode::train;
  if (s == "eval") return Mode::eval;
  throw InvalidArgument("mode", "expected train or eval; got '" + printable(s) + "'");
}

std::size_t storage_bytes(DType d) {
  return d == DType::fp16 || d == DType::bf16 ? 2 : 4;
}

DType storage_type(DType d) {
  return d == DType::tf32 || d == DType::tf32x3 ? DType::fp32 : d;
}

const char* template_type_name(DType d) {
  switch (storage_type(d)) {
    case DType::fp16:
      return "fj::half_t";
    case DType::bf16:
      return "fj::bf16_t";
    default:
      return "float";
  }
}

}  // namespace fusejit
