#include "fusejit/runtime/module.hpp"

#include <fmt/format.h>

#include <mutex>

#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"

namespace fusejit {

Module::Module(const CompiledKernel& compiled, const std::vector<std::string>& kernels) {
  std::vector<char> image = compiled.binary;
  if (compiled.is_ptx && (image.empty() || image.back() != '\0')) image.push_back('\0');
  // Test-only (util/fault.hpp): the driver rejecting the image, as for a damaged cubin.
  if (fault::fire(Fault::module_load))
    check(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData [injected fault module_load]");
  FJ_CU(cuModuleLoadData(&module_, image.data()));
  try {
    for (const auto& k : kernels) {
      CUfunction f = nullptr;
      FJ_CU(cuModuleGetFunction(&f, module_, k.c_str()));
      functions_.emplace(k, f);
    }
  } catch (...) {
    driver().cuModuleUnload(module_);
    throw;
  }
}

Module::~Module() {
  // Modules live as long as the process's cache; unloading at exit can race driver teardown.
  if (module_ && driver_available()) driver().cuModuleUnload(module_);
}

CUfunction Module::function(const std::string& name) const {
  auto it = functions_.find(name);
  if (it == functions_.end()) throw InvalidArgument("kernel", "module has no kernel " + name);
  return it->second;
}

std::vector<int> Module::read_ints(const char* symbol, std::size_t count) const {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  FJ_CU(cuModuleGetGlobal(&ptr, &bytes, module_, symbol));
  if (bytes != count * sizeof(int))
    throw Error(fmt::format("{} has {} bytes, expected {}", symbol, bytes, count * sizeof(int)));
  std::vector<int> v(count);
  FJ_CU(cuMemcpyDtoH(v.data(), ptr, bytes));
  return v;
}

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::pair<CUcontext, std::string>, std::shared_ptr<const Module>> modules;
};

Registry& registry() {
  // Leaked on purpose: modules must not be unloaded by static destructors after the driver
  // may already be shutting down.
  static Registry* r = new Registry;
  return *r;
}

CUcontext current_context() {
  CUcontext ctx = nullptr;
  FJ_CU(cuCtxGetCurrent(&ctx));
  if (!ctx) throw Error("no current CUDA context (make one current or let Plan choose a device)");
  return ctx;
}

}  // namespace

std::shared_ptr<const Module> Module::find(const std::string& key) {
  Registry& r = registry();
  const CUcontext ctx = current_context();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.modules.find({ctx, key});
  return it == r.modules.end() ? nullptr : it->second;
}

std::shared_ptr<const Module> Module::get(const std::string& key, const CompiledKernel& compiled,
                                          const std::vector<std::string>& kernels) {
  Registry& r = registry();
  const CUcontext ctx = current_context();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.modules[{ctx, key}];
  if (!slot) slot = std::make_shared<const Module>(compiled, kernels);
  return slot;
}

}  // namespace fusejit
