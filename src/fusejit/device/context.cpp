#include "fusejit/device/context.hpp"

#include "fusejit/device.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"

namespace fusejit {

CUcontext current_or_primary_context(int ordinal) {
  CUcontext ctx = nullptr;
  FJ_CU(cuCtxGetCurrent(&ctx));
  return ctx ? ctx : primary_context(ordinal);
}

CUcontext context_for(int ordinal) {
  return ordinal >= 0 ? primary_context(ordinal) : current_or_primary_context(0);
}

ScopedContext::ScopedContext(CUcontext ctx) noexcept {
  const Driver& d = driver();
  saved_ = d.cuCtxGetCurrent(&previous_) == CUDA_SUCCESS;
  if (saved_ && ctx != nullptr && ctx != previous_) d.cuCtxSetCurrent(ctx);
}

ScopedContext::ScopedContext(CUcontext ctx, Checked) {
  FJ_CU(cuCtxGetCurrent(&previous_));
  if (ctx != previous_) FJ_CU(cuCtxSetCurrent(ctx));
  saved_ = true;
}

ScopedContext::~ScopedContext() {
  if (!saved_) return;
  CUcontext now = nullptr;
  const Driver& d = driver();
  if (d.cuCtxGetCurrent(&now) == CUDA_SUCCESS && now != previous_) d.cuCtxSetCurrent(previous_);
}

}  // namespace fusejit
