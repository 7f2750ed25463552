// RAII owners of device memory, streams and events, through the dlopen'ed driver
// (fusejit::driver()), for the checker, the benchmark, the reference op and tests. Every driver
// call is checked and throws CudaError; destructors never throw (they run during unwinding).
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusejit/device/context.hpp"

namespace fusejit {

// One cuMemAlloc'ed block in one context. The allocation is rounded up to a multiple of 4 bytes
// so 32-bit fills (poison patterns) always cover every byte; size() is what was asked for.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates in the current context (or device 0's primary context when none is current).
  // Zero bytes gives an empty buffer with a null address.
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&&) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr address() const { return ptr_; }
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(ptr_);
  }
  std::size_t size() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  CUcontext context() const { return ctx_; }

  // Copies of `bytes` at byte `offset` (checked against size()) that have reached their
  // destination when they return. They run on the legacy stream and do not wait for kernels on
  // other non-blocking streams (fusejit::Stream): synchronize a stream still using the buffer
  // first.
  void upload(const void* src, std::size_t bytes, std::size_t offset = 0);
  void download(void* dst, std::size_t bytes, std::size_t offset = 0) const;
  template <class T>
  void upload(const std::vector<T>& v) {
    upload(v.data(), v.size() * sizeof(T));
  }
  template <class T>
  std::vector<T> download_as(std::size_t count) const {
    std::vector<T> out(count);
    download(out.data(), count * sizeof(T));
    return out;
  }
  std::vector<unsigned char> download_bytes() const;

  // Stream-ordered copy of host memory (pageable memory is staged by the driver).
  void upload_async(CUstream stream, const void* src, std::size_t bytes, std::size_t offset = 0);

  // Every byte of the allocation := value (cuMemsetD8).
  void fill_bytes(unsigned char value);
  void fill_bytes_async(CUstream stream, unsigned char value);
  // Every 32-bit word of the allocation := word (cuMemsetD32), e.g. two fp16 NaNs.
  void fill_words(std::uint32_t word);

 private:
  void release() noexcept;
  void check_range(std::size_t bytes, std::size_t offset, const char* what) const;

  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
  std::size_t capacity_ = 0;
  CUcontext ctx_ = nullptr;
};

// A non-blocking stream (does not synchronize with the legacy default stream).
class Stream {
 public:
  Stream();  // in the current context (device 0's primary context when none is current)
  ~Stream();
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const { return stream_; }
  operator CUstream() const { return stream_; }
  void synchronize() const;

 private:
  CUstream stream_ = nullptr;
  CUcontext ctx_ = nullptr;
};

// A timing event.
class Event {
 public:
  Event();
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const { return event_; }
  void record(CUstream stream) const;
  void synchronize() const;
  // Milliseconds from `start` to `end` (both recorded and complete).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  CUevent event_ = nullptr;
  CUcontext ctx_ = nullptr;
};

}  // namespace fusejit
