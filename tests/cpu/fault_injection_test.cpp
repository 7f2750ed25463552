// Fault injection (util/fault.hpp) on the CPU side of the pipeline: NVRTC failing, the disk
// filling up and the cache directory turning read-only. Each must surface as the documented
// exception or degradation, leave no partial cache entry or temp file, and a retry after the
// fault must succeed. (Module load and kernel launch faults need a GPU:
// tests/gpu/fault_injection_gpu_test.cpp.)
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "test_process.hpp"
#include "test_tempdir.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/codegen/kernel_source.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"
#include "fusejit/util/hash.hpp"
#include "fusejit/util/log.hpp"

namespace fs = std::filesystem;
using fusejit::Fault;
namespace fault = fusejit::fault;

namespace {

// Warnings must reach the logger for log_warning_count() to see them, whatever the caller's
// environment says; and no fault may come armed from it. Runs before main, so before first use.
const bool kEnvSet = [] {
  return ::setenv("FUSEJIT_LOG_LEVEL", "warn", 1) == 0 && ::unsetenv("FUSEJIT_FAULTS") == 0;
}();

// Every test leaves the process with nothing armed, whichever way it exits.
struct Disarm {
  Disarm() { fault::disarm_all(); }
  ~Disarm() { fault::disarm_all(); }
};

using fusejit::test::in_child;
using fusejit::test::TempDir;

// Every file in `dir` (entries, temp files, anything): a fault must leave none behind.
std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename().string());
  return out;
}

// A kernel NVRTC compiles in milliseconds; `tag` makes its cache key unique to one test.
fusejit::KernelSource tiny_kernel(const std::string& tag) {
  fusejit::KernelSource s;
  s.name = "fault_probe_" + tag;
  s.text = "// " + tag + "\nextern \"C\" __global__ void fj_probe(float* p) { p[threadIdx.x] = " +
           std::to_string(tag.size()) + ".5f; }\n";
  s.options = {"--std=c++17"};
  s.kernels = {"fj_probe"};
  return s;
}

std::vector<char> payload(std::size_t n) {
  std::vector<char> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>(1 + i % 251);  // never zero
  return out;
}

struct Command {
  int code = -1;
  std::string out;  // stdout and stderr together
};

Command run_cli(const std::string& env, const std::string& args) {
  const char* cli = std::getenv("FUSEJIT_CLI");
  REQUIRE_MESSAGE(cli, "FUSEJIT_CLI is set by tests/CMakeLists.txt");
  Command r;
  FILE* f = ::popen((env + " " + cli + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(f);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), f)) r.out += buf.data();
  const int status = ::pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST_CASE("fire() is false when unarmed, fires exactly the armed count, and disarms") {
  REQUIRE(kEnvSet);
  Disarm d;
  for (int i = 0; i < fusejit::kFaultCount; ++i) CHECK_FALSE(fault::fire(static_cast<Fault>(i)));

  const int before = fault::fired(Fault::disk_full);
  fault::arm(Fault::disk_full, 2);
  CHECK_FALSE(fault::fire(Fault::disk_read_only));  // arming one fault arms only that one
  CHECK(fault::fire(Fault::disk_full));
  CHECK(fault::fire(Fault::disk_full));
  CHECK_FALSE(fault::fire(Fault::disk_full));
  CHECK(fault::fired(Fault::disk_full) == before + 2);

  fault::arm(Fault::module_load, fault::kAlways);
  for (int i = 0; i < 10; ++i) CHECK(fault::fire(Fault::module_load));
  fault::arm(Fault::module_load, 0);
  CHECK_FALSE(fault::fire(Fault::module_load));

  fault::arm(Fault::kernel_launch, fault::kAlways);
  fault::arm(Fault::nvrtc_compile, 3);
  fault::disarm_all();
  CHECK_FALSE(fault::fire(Fault::kernel_launch));
  CHECK_FALSE(fault::fire(Fault::nvrtc_compile));

  for (int i = 0; i < fusejit::kFaultCount; ++i) {
    const auto f = static_cast<Fault>(i);
    CHECK(fault::parse(fault::name(f)) == f);
  }
  CHECK_FALSE(fault::parse("disk").has_value());
}

TEST_CASE("an armed count is shared exactly between threads firing at once") {
  Disarm d;
  constexpr int kArmed = 1000, kThreads = 8, kCallsEach = 400;
  fault::arm(Fault::nvrtc_compile, kArmed);
  std::atomic<int> fired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kCallsEach; ++i)
        if (fault::fire(Fault::nvrtc_compile)) fired.fetch_add(1, std::memory_order_relaxed);
    });
  for (auto& t : threads) t.join();
  CHECK(fired.load() == kArmed);
  CHECK_FALSE(fault::fire(Fault::nvrtc_compile));
}

TEST_CASE("nvrtc_compile: compile() throws CompileError saying so; a retry compiles") {
  Disarm d;
  const fusejit::KernelSource src = tiny_kernel("compile");
  fault::arm(Fault::nvrtc_compile);
  try {
    fusejit::compile(src, "sm_80");
    FAIL("compile() succeeded with an NVRTC fault armed");
  } catch (const fusejit::CompileError& e) {
    const std::string what = e.what();
    CHECK(what.find("NVRTC could not compile fault_probe_compile for sm_80") != std::string::npos);
    CHECK(what.find("NVRTC_ERROR_COMPILATION") != std::string::npos);
    CHECK(e.log().find("injected fault nvrtc_compile") != std::string::npos);
    CHECK(e.options().find("--gpu-architecture=sm_80") != std::string::npos);
  }
  const fusejit::CompiledKernel k = fusejit::compile(src, "sm_80");
  CHECK_FALSE(k.binary.empty());
  CHECK_FALSE(k.is_ptx);
}

TEST_CASE("nvrtc_compile: compile_cached stores nothing; the retry compiles, stores, then hits") {
  Disarm d;
  TempDir tmp;
  const fusejit::KernelSource src = tiny_kernel("compile_cached");
  fault::arm(Fault::nvrtc_compile);
  CHECK_THROWS_AS(fusejit::compile_cached(src, "sm_80", tmp.path().string()),
                  fusejit::CompileError);
  CHECK(files_in(tmp.path()).empty());

  const fusejit::CompiledKernel first = fusejit::compile_cached(src, "sm_80", tmp.path().string());
  CHECK_FALSE(first.cache_hit);
  CHECK_FALSE(first.binary.empty());
  const auto entries = fusejit::DiskCache(tmp.path()).list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].valid);
  CHECK(files_in(tmp.path()).size() == 1);  // the entry, no temp file

  const fusejit::CompiledKernel second = fusejit::compile_cached(src, "sm_80", tmp.path().string());
  CHECK(second.cache_hit);
  CHECK(second.binary == first.binary);
}

TEST_CASE("disk_full: store fails as on ENOSPC mid-write, warns once, leaves nothing; retry ok") {
  TempDir tmp;
  const int failed = in_child([&] {
    Disarm d;
    const fusejit::DiskCache cache(tmp.path());
    const std::string key = fusejit::Hasher().add("disk_full").hex();
    const std::uint64_t warnings = fusejit::log_warning_count();
    const int fired = fault::fired(Fault::disk_full);
    fault::arm(Fault::disk_full);
    if (cache.store(key, payload(100000), "probe")) return 1;
    if (fault::fired(Fault::disk_full) != fired + 1) return 2;  // the hook was reached
    if (!files_in(tmp.path()).empty()) return 3;                // temp file removed, no entry
    if (fusejit::log_warning_count() != warnings + 1) return 4;
    if (cache.load(key).has_value()) return 5;
    // Still full: still false, but the warning is not repeated.
    fault::arm(Fault::disk_full);
    if (cache.store(key, payload(10), "probe")) return 6;
    if (fusejit::log_warning_count() != warnings + 1) return 7;
    if (!files_in(tmp.path()).empty()) return 8;
    // Space again: the same store goes through whole.
    if (!cache.store(key, payload(100000), "probe")) return 9;
    const auto loaded = cache.load(key);
    if (!loaded || *loaded != payload(100000)) return 10;
    if (files_in(tmp.path()).size() != 1) return 11;
    return 0;
  });
  CHECK(failed == 0);
}

TEST_CASE("disk_read_only: store fails as on EACCES, warns once, leaves nothing; retry ok") {
  TempDir tmp;
  const int failed = in_child([&] {
    Disarm d;
    const fusejit::DiskCache cache(tmp.path());
    const std::string key = fusejit::Hasher().add("read_only").hex();
    const std::uint64_t warnings = fusejit::log_warning_count();
    const int fired = fault::fired(Fault::disk_read_only);
    fault::arm(Fault::disk_read_only, 2);
    if (cache.store(key, payload(1000), "probe")) return 1;
    if (cache.store(key, payload(1000), "probe")) return 2;
    if (fault::fired(Fault::disk_read_only) != fired + 2) return 3;
    if (!files_in(tmp.path()).empty()) return 4;
    if (fusejit::log_warning_count() != warnings + 1) return 5;
    if (!cache.store(key, payload(1000), "probe")) return 6;
    if (cache.load(key) != payload(1000)) return 7;
    return 0;
  });
  CHECK(failed == 0);
}

TEST_CASE("disk faults under compile_cached: the kernel still comes back, uncached; retry caches") {
  Disarm d;
  for (const Fault f : {Fault::disk_full, Fault::disk_read_only}) {
    CAPTURE(fault::name(f));
    TempDir tmp;
    const fusejit::KernelSource src = tiny_kernel("cached_" + std::string(fault::name(f)));
    fault::arm(f);
    const fusejit::CompiledKernel k = fusejit::compile_cached(src, "sm_80", tmp.path().string());
    CHECK_FALSE(k.cache_hit);
    CHECK_FALSE(k.binary.empty());
    CHECK(files_in(tmp.path()).empty());

    const fusejit::CompiledKernel again =
        fusejit::compile_cached(src, "sm_80", tmp.path().string());
    CHECK_FALSE(again.cache_hit);  // nothing was stored the first time
    CHECK(again.binary == k.binary);
    CHECK(fusejit::compile_cached(src, "sm_80", tmp.path().string()).cache_hit);
    CHECK(files_in(tmp.path()).size() == 1);
  }
}

TEST_CASE("FUSEJIT_FAULTS arms faults for a whole process: `fusejit compile` under each") {
  TempDir tmp;
  const std::string args =
      "compile --arch sm_80 --shapes 64x64x64 --dtypes fp16 --modes eval --cache-dir " +
      tmp.path().string();

  const Command nvrtc = run_cli("FUSEJIT_FAULTS=nvrtc_compile", args);
  CHECK(nvrtc.code == 1);
  CHECK_MESSAGE(nvrtc.out.find("injected fault nvrtc_compile") != std::string::npos, nvrtc.out);
  CHECK(nvrtc.out.find("fault injection armed: nvrtc_compile") != std::string::npos);
  CHECK(files_in(tmp.path()).empty());

  const Command full = run_cli("FUSEJIT_FAULTS=disk_full,bogus:1", args);
  // Compiled, but warming the cache is the command's job: not stored is a failure (exit 1).
  CHECK_MESSAGE(full.code == 1, full.out);
  CHECK(full.out.find("NOT STORED") != std::string::npos);
  CHECK(full.out.find("1 kernel set(s) could not be stored") != std::string::npos);
  CHECK(full.out.find("No space left on device") != std::string::npos);
  CHECK(full.out.find("ignoring 'bogus'") != std::string::npos);
  CHECK(full.out.find("0 hit, 1 compiled") != std::string::npos);
  CHECK(files_in(tmp.path()).empty());

  const Command ok = run_cli("FUSEJIT_FAULTS=", args);
  CHECK_MESSAGE(ok.code == 0, ok.out);
  CHECK(ok.out.find("0 hit, 1 compiled") != std::string::npos);
  CHECK(files_in(tmp.path()).size() == 1);
  CHECK(run_cli("", args).out.find("1 hit, 0 compiled") != std::string::npos);
}
