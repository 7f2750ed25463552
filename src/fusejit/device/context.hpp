// Which CUDA context work runs in, and leaving the caller's current context as it was. One
// scoped type for every "save, make current, restore" in the library: plans, the reference op,
// the tuner and device memory all switch contexts on threads that may have their own current.
#pragma once
#include <cuda.h>

namespace fusejit {

// Throws UnsupportedDevice where the driver sees no GPU, InvalidArgument("device") for an ordinal
// outside 0..count - 1: the caller's argument, not a driver failure.
void require_device_ordinal(int ordinal);

// Makes the device's primary context current on the calling thread (retaining it once per
// process) and returns it.
CUcontext primary_context(int ordinal);

// The calling thread's current context; when it has none, device `ordinal`'s primary context
// is made current (the one Plan uses by default) and returned.
CUcontext current_or_primary_context(int ordinal = 0);

// The context a Plan, reference op or tuner with option `device` works in: `ordinal` >= 0 is
// that device's primary context; -1 is the calling thread's current context, else device 0's
// primary context.
CUcontext context_for(int ordinal);

// Makes `ctx` current for its lifetime (nullptr: leaves the current context alone) and restores
// whatever was current before, so work done in another context (a buffer freed on a thread
// whose current context differs, a tuning run in the primary context) never changes the
// caller's. Never throws: it runs in destructors.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx = nullptr) noexcept;
  // The same for a run's launches, which must not go to another context: throws CudaError when
  // the current context cannot be read or `ctx` made current (nothing to restore then).
  struct Checked {};
  ScopedContext(CUcontext ctx, Checked);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool saved_ = false;
};

}  // namespace fusejit
