// One exception hierarchy for everything fusejit throws, so callers can catch fusejit::Error.
#pragma once
#include <stdexcept>
#include <string>

namespace fusejit {

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
