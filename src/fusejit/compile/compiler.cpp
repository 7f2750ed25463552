#include "fusejit/compile/compiler.hpp"

#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <regex>
#include <sstream>
#include <utility>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/device.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"
#include "fusejit/util/hash.hpp"
#include "fusejit/util/log.hpp"

namespace fusejit {

namespace {

// Bump when anything about how entries are produced changes. How they are laid out on disk is
// cache/entry_format's version: entries of another layout are found under the same key,
// rejected and rebuilt, so a layout change needs no new keys.
constexpr int kCacheFormatVersion = 1;

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS)
    throw CudaError(fmt::format("{} failed: {}", what, nvrtcGetErrorString(r)),
                    static_cast<int>(r));
}

// The generated-source lines an NVRTC log points at ("name(LINE): error ..."), so the error
// shows the offending code without a trip to the cache directory.
std::string offending_lines(const std::string& log, const KernelSource& src) {
  std::ostringstream out;
  static const std::regex where(R"re(([^\s()]+)\((\d+)\): (error|warning))re");
  int shown = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), where), end; it != end && shown < 8;
       ++it, ++shown) {
    const std::string file = (*it)[1];
    const int line = std::stoi((*it)[2]);
    const std::string* text = file == src.name + ".cu" ? &src.text : nullptr;
    for (const auto& [hn, ht] : src.headers)
      if (file == hn || (file.size() > hn.size() && file.ends_with("/" + hn))) text = &ht;
    if (!text) continue;
    std::istringstream in(*text);
    std::string l;
    for (int i = 1; std::getline(in, l); ++i)
      if (i == line) out << fmt::format("  {}:{}: {}\n", file, line, l);
  }
  return out.str();
}

struct ArchTarget {
  std::string option;  // --gpu-architecture=...
  bool ptx = false;
};

// cubin for an arch NVRTC knows; PTX of the newest arch it knows (the driver JITs it forward)
// for a GPU newer than this NVRTC.
ArchTarget target_for(const std::string& arch) {
  const Arch a = parse_arch(arch);
  const auto supported = nvrtc_supported_archs();
  if (std::find(supported.begin(), supported.end(), a.cc) != supported.end())
    return {"--gpu-architecture=" + a.sm(), false};
  const int newest = supported.empty() ? 80 : supported.back();
  if (a.cc > newest) return {fmt::format("--gpu-architecture=compute_{}", newest), true};
  throw InvalidArgument("arch", fmt::format("NVRTC {} cannot target {}", nvrtc_version(), arch));
}

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

std::vector<int> nvrtc_supported_archs() {
  static const std::vector<int> archs = [] {
    int n = 0;
    check_nvrtc(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
    std::vector<int> v(static_cast<std::size_t>(n));
    check_nvrtc(nvrtcGetSupportedArchs(v.data()), "nvrtcGetSupportedArchs");
    std::sort(v.begin(), v.end());
    return v;
  }();
  return archs;
}

std::vector<std::string> compile_options(const KernelSource& src, const std::string& arch) {
  std::vector<std::string> opts = src.options;
  const ArchTarget target = target_for(arch);
  opts.push_back(target.option);
  if (!target.ptx) opts.push_back("--ptxas-options=-v");
  return opts;
}

CompiledKernel compile(const KernelSource& src, const std::string& arch) {
  const auto t0 = std::chrono::steady_clock::now();
  const ArchTarget target = target_for(arch);
  std::vector<const char*> header_text, header_names;
  for (const auto& [n, t] : src.headers) {
    header_names.push_back(n.c_str());
    header_text.push_back(t.c_str());
  }
  nvrtcProgram prog = nullptr;
  const std::string file = src.name + ".cu";
  check_nvrtc(nvrtcCreateProgram(&prog, src.text.c_str(), file.c_str(),
                                 static_cast<int>(header_text.size()), header_text.data(),
                                 header_names.data()),
              "nvrtcCreateProgram");
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });
  const auto opts = compile_options(src, arch);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  // Test-only (util/fault.hpp): fail as NVRTC does on bad source, without the compile time.
  const bool injected = fault::fire(Fault::nvrtc_compile);
  const nvrtcResult r =
      injected ? NVRTC_ERROR_COMPILATION
               : nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data());
  std::size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 1) nvrtcGetProgramLog(prog, log.data());
  if (injected) log = "injected fault nvrtc_compile (fusejit/util/fault.hpp or FUSEJIT_FAULTS)";
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  std::string joined;
  for (const auto& o : opts) joined += (joined.empty() ? "" : " ") + o;
  if (r != NVRTC_SUCCESS)
    throw CompileError(
        fmt::format("NVRTC could not compile {} for {} ({}); options: {}\n{}", src.name, arch,
                    nvrtcGetErrorString(r), joined, offending_lines(log, src)),
        log, joined);
  // ptxas's -v report (every cubin has one) is kept apart from what NVRTC said.
  PtxasReport report = read_ptxas_report(log);
  if (!report.rest.empty()) fusejit::log()->debug("NVRTC log for {}:\n{}", src.name, report.rest);
  CompiledKernel out;
  out.arch = arch;
  out.is_ptx = target.ptx;
  out.functions = std::move(report.functions);
  if (const std::string spills = describe_spills(out.functions); !spills.empty())
    fusejit::log()->debug("ptxas spilled registers compiling {} for {}: {}", src.name, arch,
                          spills);
  std::size_t size = 0;
  if (target.ptx) {
    check_nvrtc(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");
    out.binary.resize(size);
    check_nvrtc(nvrtcGetPTX(prog, out.binary.data()), "nvrtcGetPTX");
  } else {
    check_nvrtc(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    out.binary.resize(size);
    check_nvrtc(nvrtcGetCUBIN(prog, out.binary.data()), "nvrtcGetCUBIN");
  }
  out.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string cache_key(const KernelSource& src, const std::string& arch,
                      const std::string& nvrtc_version_text) {
  Hasher h;
  h.add(fmt::format("fusejit-cache-format-{}", kCacheFormatVersion));
  h.add(nvrtc_version_text);
  h.add(arch);
  for (const auto& o : src.options) h.add(o);
  h.add(src.text);
  // Only the headers' bytes matter, but hashing all of them keeps the rule simple and safe.
  for (const auto& [n, t] : src.headers) {
    h.add(n);
    h.add(t);
  }
  return h.hex();
}

CompiledKernel compile_cached(const KernelSource& src, const std::string& arch,
                              const std::string& cache_dir) {
  const DiskCache cache(DiskCache::resolve_dir(cache_dir));
  const ArchTarget target = target_for(arch);
  const std::string key = cache_key(src, arch, nvrtc_version());
  if (auto bytes = cache.load(key)) {
    CompiledKernel out;
    out.arch = arch;
    out.is_ptx = target.ptx;
    out.binary = std::move(*bytes);
    out.cache_hit = true;
    out.stored = true;
    return out;
  }
  CompiledKernel out = compile(src, arch);
  out.stored =
      cache.store(key, out.binary, src.name + " " + arch + (out.is_ptx ? " ptx" : " cubin"));
  return out;
}

}  // namespace fusejit
