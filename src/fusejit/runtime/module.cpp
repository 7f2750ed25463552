#include "fusejit/runtime/module.hpp"

#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <system_error>
#include <utility>

#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"
#include "fusejit/util/log.hpp"

namespace fusejit {

namespace {
std::atomic<std::size_t>& live_modules() {
  static std::atomic<std::size_t> n{0};
  return n;
}
}  // namespace

Module::Module(const CompiledKernel& compiled, const std::vector<std::string>& kernels) {
  std::vector<char> image = compiled.binary;
  if (compiled.is_ptx && (image.empty() || image.back() != '\0')) image.push_back('\0');
  // Test-only (util/fault.hpp): the driver rejecting the image, as for a damaged cubin.
  if (fault::fire(Fault::module_load))
    check(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData [injected fault module_load]");
  FJ_CU(cuModuleLoadData(&module_, image.data()));
  live_modules().fetch_add(1, std::memory_order_relaxed);
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
  // Runs when the cache has dropped a module and the last plan using it went; the cache's own
  // modules are leaked at exit, since unloading then can race driver teardown.
  if (module_ && driver_available()) driver().cuModuleUnload(module_);
  if (module_) live_modules().fetch_sub(1, std::memory_order_relaxed);
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

constexpr std::size_t kDefaultMaxLoaded = 256;

// FUSEJIT_MAX_KERNEL_SETS when it is a positive integer; anything else warns (once) and is
// ignored, since a typo must not silently turn the bound off (or down to nothing). Read on
// each call, not cached, so set_max_loaded(0) sees the environment as it is now.
std::size_t default_max_loaded() {
  const char* text = std::getenv("FUSEJIT_MAX_KERNEL_SETS");
  if (text == nullptr || *text == '\0') return kDefaultMaxLoaded;
  std::size_t n = 0;
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, n);
  if (ec != std::errc() || ptr != end || n == 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      log()->warn("FUSEJIT_MAX_KERNEL_SETS='{}' is not a positive integer; using {}", text,
                  kDefaultMaxLoaded);
    return kDefaultMaxLoaded;
  }
  return n;
}

using RegistryKey = std::pair<CUcontext, std::string>;

struct Registry {
  struct Slot {
    std::shared_ptr<const Module> module;
    std::list<const RegistryKey*>::iterator recency;
  };
  std::mutex mu;
  std::map<RegistryKey, Slot> modules;
  // Most recently used first; points at the map's keys, which std::map never moves.
  std::list<const RegistryKey*> recency;
  std::size_t max_loaded = default_max_loaded();

  void touch(Slot& slot) { recency.splice(recency.begin(), recency, slot.recency); }
  // Moves the least recently used modules past the bound into `dropped`, to be released
  // after `mu` is: unloading a module (when no plan holds it) is a driver call.
  void evict(std::vector<std::shared_ptr<const Module>>& dropped) {
    while (modules.size() > max_loaded) {
      auto it = modules.find(*recency.back());
      recency.pop_back();
      dropped.push_back(std::move(it->second.module));
      modules.erase(it);
    }
  }
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
  if (it == r.modules.end()) return nullptr;
  r.touch(it->second);
  return it->second.module;
}

std::shared_ptr<const Module> Module::get(const std::string& key, const CompiledKernel& compiled,
                                          const std::vector<std::string>& kernels) {
  Registry& r = registry();
  const CUcontext ctx = current_context();
  std::vector<std::shared_ptr<const Module>> dropped;
  std::lock_guard<std::mutex> lock(r.mu);
  RegistryKey id{ctx, key};
  if (auto it = r.modules.find(id); it != r.modules.end()) {
    r.touch(it->second);
    return it->second.module;
  }
  // Loaded before it is inserted: a load that throws leaves the registry as it was.
  auto module = std::make_shared<const Module>(compiled, kernels);
  auto it = r.modules.emplace(std::move(id), Registry::Slot{module, {}}).first;
  r.recency.push_front(&it->first);
  it->second.recency = r.recency.begin();
  // The module just loaded is the most recent, so the bound (at least 1) never drops it.
  r.evict(dropped);
  return module;
}

void Module::set_max_loaded(std::size_t count) {
  Registry& r = registry();
  std::vector<std::shared_ptr<const Module>> dropped;
  std::lock_guard<std::mutex> lock(r.mu);
  r.max_loaded = count == 0 ? default_max_loaded() : count;
  r.evict(dropped);
}

std::size_t Module::max_loaded() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.max_loaded;
}

std::size_t Module::live_count() {
  return live_modules().load(std::memory_order_relaxed);
}

std::size_t Module::loaded_count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.modules.size();
}

}  // namespace fusejit
