// Fault injection (util/fault.hpp) through Plan on a GPU: NVRTC failing, the module load
// failing, a kernel launch failing and the disk filling up while a plan is made. Each surfaces as
// the documented exception (or degradation), leaves no partial cache entry, writes no output
// byte, and a retry after the fault succeeds with correct results (float64 reference).
// Every test uses its own problem shape and cache directory, so neither the in-process plan and
// module caches nor an earlier test's disk entries can turn the retry into a hit by accident.
#include <doctest/doctest.h>

#include <stdlib.h>
#include "test_tempdir.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/util/fault.hpp"
#include "fusejit/verify/cpu_reference.hpp"
#include "gpu_required.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

namespace fs = std::filesystem;
using namespace fusejit;

namespace {

struct Disarm {
  Disarm() { fault::disarm_all(); }
  ~Disarm() { fault::disarm_all(); }
};

using fusejit::test::TempDir;

std::size_t file_count(const fs::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// An fp32 train problem (every kernel of the train schedule runs) of a shape unique to `id`.
Problem problem(int id) {
  Problem p;
  p.M = 96 + id;
  p.N = 64 + 8 * id;
  p.K = 40;
  p.dtype = DType::fp32;
  p.mode = Mode::train;
  return p;
}

std::vector<float> draw(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = d(rng);
    while (x == 0.0f);  // never zeros
  }
  return v;
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// Device inputs and outputs of one problem, outputs poisoned with NaN.
struct Case {
  Problem p;
  ReferenceInputs in;
  DeviceBuffer x, w, y, bias, scale, gamma, beta, rm, rv;

  explicit Case(const Problem& problem) : p(problem) {
    std::mt19937 rng(1234u + static_cast<unsigned>(p.N));
    const auto M = static_cast<std::size_t>(p.M), N = static_cast<std::size_t>(p.N),
               K = static_cast<std::size_t>(p.K);
    const float wb = 1.0f / std::sqrt(static_cast<float>(K));
    const auto hx = draw(M * K, rng, -1, 1), hw = draw(N * K, rng, -wb, wb),
               hb = draw(N, rng, -1, 1), hs = draw(N, rng, 0.5f, 2), hg = draw(N, rng, 0.5f, 1.5f),
               hbe = draw(N, rng, -1, 1), hrm = draw(N, rng, -0.5f, 0.5f),
               hrv = draw(N, rng, 0.5f, 2);
    in.M = p.M, in.N = p.N, in.K = p.K;
    in.x = widen(hx), in.w = widen(hw), in.bias = widen(hb), in.scale = widen(hs);
    in.gamma = widen(hg), in.beta = widen(hbe), in.running_mean = widen(hrm);
    in.running_var = widen(hrv);
    auto up = [](DeviceBuffer& b, const std::vector<float>& v) {
      b = DeviceBuffer(v.size() * sizeof(float));
      b.upload(v);
    };
    up(x, hx), up(w, hw), up(bias, hb), up(scale, hs), up(gamma, hg), up(beta, hbe);
    up(rm, hrm), up(rv, hrv);
    y = DeviceBuffer(M * N * sizeof(float));
    y.fill_words(0x7fc00000u);  // NaN: an unwritten output cannot pass
  }

  Tensors tensors() const {
    Tensors t;
    t.x = x.get(), t.w = w.get(), t.y = y.get(), t.bias = bias.get(), t.scale = scale.get();
    t.gamma = gamma.get(), t.beta = beta.get(), t.running_mean = rm.get();
    t.running_var = rv.get();
    return t;
  }

  // One run's results against the float64 reference of one step from the initial state.
  void check_one_step() const {
    const ReferenceOutputs ref = reference_forward(in, reference_settings(p));
    const auto n = static_cast<std::size_t>(p.N);
    CHECK(rel_err(y.download_as<float>(static_cast<std::size_t>(p.M) * n), ref.y) < 1e-5);
    CHECK(rel_err(rm.download_as<float>(n), ref.running_mean) < 1e-5);
    CHECK(rel_err(rv.download_as<float>(n), ref.running_var) < 1e-5);
  }
};

void run_and_check(const Plan& plan, Case& c) {
  plan.run(nullptr, c.tensors());
  FJ_CU(cuCtxSynchronize());
  c.check_one_step();
}

}  // namespace

TEST_CASE("nvrtc_compile: Plan throws CompileError, stores nothing; the retry compiles and runs") {
  Disarm d;
  TempDir dir;
  PlanOptions o;
  o.cache_dir = dir.str();
  Case c(problem(1));
  fault::arm(Fault::nvrtc_compile);
  try {
    Plan failed(c.p, o);
    FAIL("Plan succeeded with an NVRTC fault armed");
  } catch (const CompileError& e) {
    CHECK(std::string(e.what()).find("injected fault nvrtc_compile") != std::string::npos);
  }
  CHECK(file_count(dir.path()) == 0);
  // Plan erased the failed in-process entry, so this is a real second attempt.
  const Plan plan(c.p, o);
  CHECK_FALSE(plan.cache_hit());
  CHECK(plan.compile_seconds() > 0);
  run_and_check(plan, c);
  CHECK(DiskCache(dir.path()).list().size() == 1);
}

TEST_CASE("module_load: Plan throws CudaError; the stored entry stays valid; the retry loads it") {
  Disarm d;
  TempDir dir;
  PlanOptions o;
  o.cache_dir = dir.str();
  Case c(problem(2));
  fault::arm(Fault::module_load);
  try {
    Plan failed(c.p, o);
    FAIL("Plan succeeded with a module load fault armed");
  } catch (const CudaError& e) {
    CHECK(e.code() == CUDA_ERROR_INVALID_IMAGE);
    CHECK(std::string(e.what()).find("injected fault module_load") != std::string::npos);
  }
  // The compiled binary was good and was stored whole before the load failed.
  const auto entries = DiskCache(dir.path()).list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].valid);
  CHECK(file_count(dir.path()) == 1);
  const Plan plan(c.p, o);
  CHECK(plan.cache_hit());  // from disk: nothing was loaded in-process
  run_and_check(plan, c);
}

TEST_CASE("kernel_launch: run throws CudaError and writes nothing; the next run is correct") {
  Disarm d;
  TempDir dir;
  PlanOptions o;
  o.cache_dir = dir.str();
  Case c(problem(3));
  const Plan plan(c.p, o);
  const auto y0 = c.y.download_bytes(), rm0 = c.rm.download_bytes(), rv0 = c.rv.download_bytes();
  fault::arm(Fault::kernel_launch);
  try {
    plan.run(nullptr, c.tensors());
    FAIL("run succeeded with a launch fault armed");
  } catch (const CudaError& e) {
    CHECK(e.code() == CUDA_ERROR_LAUNCH_FAILED);
    CHECK(std::string(e.what()).find("injected fault kernel_launch") != std::string::npos);
  }
  FJ_CU(cuCtxSynchronize());
  CHECK(c.y.download_bytes() == y0);  // still all poison
  CHECK(c.rm.download_bytes() == rm0);
  CHECK(c.rv.download_bytes() == rv0);
  run_and_check(plan, c);
}

TEST_CASE("disk_full while planning: the plan works uncached, nothing is left; later plans cache") {
  Disarm d;
  TempDir dir;
  PlanOptions o;
  o.cache_dir = dir.str();
  Case c(problem(4));
  fault::arm(Fault::disk_full);
  const Plan plan(c.p, o);
  CHECK(fault::fired(Fault::disk_full) >= 1);
  CHECK(file_count(dir.path()) == 0);
  run_and_check(plan, c);
  // A different problem after the fault is stored normally.
  Case c2(problem(5));
  const Plan plan2(c2.p, o);
  CHECK(DiskCache(dir.path()).list().size() == 1);
  run_and_check(plan2, c2);
}
