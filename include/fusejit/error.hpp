// One exception hierarchy for everything fusejit throws, so callers can catch fusejit::Error.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

// The installed API: exported from libfusejit.so, which hides everything else.
#pragma GCC visibility push(default)
namespace fusejit {

// `text` (a caller's input) for an error message: printable ASCII as it is, a backslash doubled,
// every other byte (control characters, DEL, bytes of multi-byte characters) as \xNN, so the
// message stays on one line and cannot carry terminal escape sequences.
inline std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller-supplied value is wrong; `argument()` names it (e.g. "M", "x", "ldw").
class InvalidArgument : public Error {
 public:
  InvalidArgument(std::string argument, const std::string& message)
      : Error("invalid argument '" + argument + "': " + message), argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

// No driver, no GPU, or a GPU fusejit cannot run on (compute capability < 8.0).
class UnsupportedDevice : public Error {
 public:
  using Error::Error;
};

// NVRTC rejected generated source; carries the log and the options used.
class CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string log, std::string options)
      : Error(message + "\n" + log), log_(std::move(log)), options_(std::move(options)) {}
  const std::string& log() const noexcept { return log_; }
  const std::string& options() const noexcept { return options_; }

 private:
  std::string log_, options_;
};

// A CUDA driver, cuBLASLt or NVRTC call failed; `code()` is that library's status value.
class CudaError : public Error {
 public:
  CudaError(const std::string& message, int code) : Error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// The on-disk cache could not be used as asked (explicit cache commands only; the JIT path
// degrades to in-memory compilation instead of throwing this).
class CacheError : public Error {
 public:
  using Error::Error;
};

}  // namespace fusejit
#pragma GCC visibility pop
