#include "fusejit/device/device_memory.hpp"

#include <fmt/format.h>

#include <utility>

#include "fusejit/device/context.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"

namespace fusejit {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  ctx_ = current_or_primary_context();
  capacity_ = (bytes + 3) / 4 * 4;
  FJ_CU(cuMemAlloc(&ptr_, capacity_));
}

DeviceBuffer::~DeviceBuffer() {
  release();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, 0)),
      bytes_(std::exchange(o.bytes_, 0)),
      capacity_(std::exchange(o.capacity_, 0)),
      ctx_(std::exchange(o.ctx_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (ptr_ && driver_available()) {
    ScopedContext guard(ctx_);
    driver().cuMemFree(ptr_);
  }
  ptr_ = 0;
  bytes_ = capacity_ = 0;
  ctx_ = nullptr;
}

void DeviceBuffer::check_range(std::size_t bytes, std::size_t offset, const char* what) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw InvalidArgument(what, fmt::format("{} bytes at offset {} exceed the buffer's {} bytes",
                                            bytes, offset, bytes_));
}

// A copy from pageable memory returns once the source is staged, not once it has reached the
// device (CUDA's "API synchronization behavior"), and non-blocking streams do not wait for the
// legacy stream's DMA: without the wait, a kernel queued right after an upload could read the
// buffer's old contents (gpu_backward_test saw it: a run on dy just uploaded over other values
// read some of the old ones).
void DeviceBuffer::upload(const void* src, std::size_t bytes, std::size_t offset) {
  check_range(bytes, offset, "upload");
  if (!bytes) return;
  FJ_CU(cuMemcpyHtoD(ptr_ + offset, src, bytes));
  FJ_CU(cuStreamSynchronize(nullptr));
}

void DeviceBuffer::download(void* dst, std::size_t bytes, std::size_t offset) const {
  check_range(bytes, offset, "download");
  if (bytes) FJ_CU(cuMemcpyDtoH(dst, ptr_ + offset, bytes));
}

std::vector<unsigned char> DeviceBuffer::download_bytes() const {
  std::vector<unsigned char> out(bytes_);
  download(out.data(), bytes_);
  return out;
}

void DeviceBuffer::upload_async(CUstream stream, const void* src, std::size_t bytes,
                                std::size_t offset) {
  check_range(bytes, offset, "upload");
  if (bytes) FJ_CU(cuMemcpyHtoDAsync(ptr_ + offset, src, bytes, stream));
}

// The plain memsets run on the legacy stream and return before they finish; non-blocking
// streams (fusejit::Stream) do not wait for it. Waiting here makes "filled" mean filled, so a
// poison cannot land after the kernel that was meant to overwrite it.
void DeviceBuffer::fill_bytes(unsigned char value) {
  if (!capacity_) return;
  FJ_CU(cuMemsetD8(ptr_, value, capacity_));
  FJ_CU(cuStreamSynchronize(nullptr));
}

void DeviceBuffer::fill_bytes_async(CUstream stream, unsigned char value) {
  if (capacity_) FJ_CU(cuMemsetD8Async(ptr_, value, capacity_, stream));
}

void DeviceBuffer::fill_words(std::uint32_t word) {
  if (!capacity_) return;
  FJ_CU(cuMemsetD32(ptr_, word, capacity_ / 4));
  FJ_CU(cuStreamSynchronize(nullptr));
}

Stream::Stream() : ctx_(current_or_primary_context()) {
  FJ_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
}

Stream::~Stream() {
  if (stream_ && driver_available()) {
    ScopedContext guard(ctx_);
    driver().cuStreamDestroy(stream_);
  }
}

Stream::Stream(Stream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)), ctx_(std::exchange(o.ctx_, nullptr)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    Stream dead(std::move(*this));
    stream_ = std::exchange(o.stream_, nullptr);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const {
  FJ_CU(cuStreamSynchronize(stream_));
}

Event::Event() : ctx_(current_or_primary_context()) {
  FJ_CU(cuEventCreate(&event_, CU_EVENT_DEFAULT));
}

Event::~Event() {
  if (event_ && driver_available()) {
    ScopedContext guard(ctx_);
    driver().cuEventDestroy(event_);
  }
}

Event::Event(Event&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), ctx_(std::exchange(o.ctx_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event dead(std::move(*this));
    event_ = std::exchange(o.event_, nullptr);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void Event::record(CUstream stream) const {
  FJ_CU(cuEventRecord(event_, stream));
}

void Event::synchronize() const {
  FJ_CU(cuEventSynchronize(event_));
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  FJ_CU(cuEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

}  // namespace fusejit
