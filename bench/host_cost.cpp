// fusejit_host_bench: what fusejit costs the host (issue 15, M at run time). Planning a loop of
// batch sizes, a hot Plan, host time per run against the bare cuBLASLt GEMM, a small layer end
// to end, dynamic-M against exact-M kernels, and a bounded-cache soak; a summary table last.
//   fusejit_host_bench [--quick] [--only 0123456] [--out FILE.json]
// Every plan uses one fresh temporary cache directory (removed at exit), so the dispatch is the
// built-in heuristic (empty tuning database) and section 1 sees a cold disk cache.
#include <fmt/format.h>
#include <stdlib.h>
#include <time.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/config/candidates.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/plan/tma_descriptor.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/runtime/module.hpp"
#include "fusejit/verify/verification.hpp"

namespace {

using namespace fusejit;

double thread_cpu_us() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
    throw std::runtime_error(std::string("clock_gettime(CLOCK_THREAD_CPUTIME_ID): ") +
                             std::strerror(errno));
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

double wall_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Resident set size of this process in MiB, from /proc/self/status.
double rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  throw std::runtime_error("no VmRSS line in /proc/self/status");
}

double gpu_free_mib() {
  std::size_t free = 0, total = 0;
  FJ_CU(cuMemGetInfo(&free, &total));
  return static_cast<double>(free) / (1024.0 * 1024.0);
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it when this goes.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/fusejit-host-bench-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr)
      throw std::runtime_error(fmt::format("mkdtemp({}): {}", tmpl, std::strerror(errno)));
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Every measurement goes to the JSON file; headline ones also to the summary table.
class Report {
 public:
  explicit Report(std::string out) : out_(std::move(out)) {}

  void add(const std::string& name, nlohmann::json value, const std::string& unit) {
    measurements_.push_back({{"name", name}, {"value", std::move(value)}, {"unit", unit}});
  }
  // `pass` empty: no target (informational).
  void headline(const std::string& name, double value, const std::string& unit,
                const std::string& target, std::optional<bool> pass) {
    add(name, value, unit);
    measurements_.back()["target"] = target;
    if (pass) measurements_.back()["pass"] = *pass;
    summary_.push_back({name, fmt::format("{:.2f} {}", value, unit), target,
                        pass ? (*pass ? "PASS" : "MISS") : "-"});
  }
  void headline_text(const std::string& name, const std::string& value) {
    add(name, value, "");
    summary_.push_back({name, value, "", "-"});
  }
  void error(const std::string& where, const std::string& what) {
    fmt::print("ERROR in {}: {}\n", where, what);
    errors_.push_back({{"where", where}, {"error", what}});
    summary_.push_back({where, "ERROR", "", "ERROR"});
  }
  void set_info(const std::string& key, nlohmann::json value) { info_[key] = std::move(value); }
  bool failed() const { return !errors_.empty(); }

  // Rewritten after every section, so a run cut short still leaves what it measured.
  void save() const {
    if (out_.empty()) return;
    nlohmann::json j;
    j["info"] = info_;
    j["measurements"] = measurements_;
    j["errors"] = errors_;
    const std::string tmp = out_ + ".tmp";
    {
      std::ofstream f(tmp);
      f << j.dump(2) << "\n";
      if (!f) {
        fmt::print("ERROR: could not write {}\n", tmp);
        return;
      }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, out_, ec);
    if (ec) fmt::print("ERROR: could not rename {} to {}: {}\n", tmp, out_, ec.message());
  }

  void print_summary() const {
    fmt::print("\n== Summary\n{:<50} {:>22} {:>20}  {}\n", "item", "value", "target", "result");
    for (const auto& s : summary_)
      fmt::print("{:<50} {:>22} {:>20}  {}\n", s.name, s.value, s.target, s.status);
  }

 private:
  struct Line {
    std::string name, value, target, status;
  };
  std::string out_;
  nlohmann::json info_ = nlohmann::json::object();
  nlohmann::json measurements_ = nlohmann::json::array();
  nlohmann::json errors_ = nlohmann::json::array();
  std::vector<Line> summary_;
};

Problem layer(std::int64_t M, std::int64_t N, std::int64_t K, Mode mode) {
  Problem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.dtype = DType::bf16;
  p.mode = mode;
  return p;
}

std::string label(const Problem& p) {
  return fmt::format("{}x{}x{}.bf16.{}", p.M, p.N, p.K, name(p.mode));
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// `sets` device copies of one set of fresh random inputs (x ~ U[0,1) as KernelBench draws it,
// never zero), outputs poisoned; buffers sized for p.M rows.
struct Inputs {
  Inputs(const Problem& p, int sets) {
    SweepCase c;
    c.problem = p;
    c.distribution = Distribution::non_centred;
    const CaseInputs in = make_case_inputs(c);
    data.reserve(static_cast<std::size_t>(sets));
    for (int i = 0; i < sets; ++i) data.emplace_back(in);
    for (const auto& d : data) tensors.push_back(d.tensors());
  }
  std::vector<DeviceCase> data;
  std::vector<Tensors> tensors;
};

struct Context {
  Report& report;
  const Device& device;
  const Stream& stream;
  std::string cache_dir;
  bool quick = false;

  PlanOptions options() const {
    PlanOptions o;
    o.device = 0;
    o.cache_dir = cache_dir;
    o.autotune = false;  // bounded run time whatever FUSEJIT_AUTOTUNE says
    return o;
  }
};

// 1. Planning a loop of batch sizes, cold then hot.
void section_planning(Context& c) {
  fmt::print("\n== 1. Planning a loop of batch sizes (4096x4096 bf16 train, fresh cache dir)\n");
  const std::vector<std::int64_t> ms = {1000, 1001, 999, 1024, 512, 257, 2048, 4000, 3, 77};
  const PlanOptions o = c.options();
  std::set<std::pair<std::int64_t, std::int64_t>> classes;
  double total_ms = 0;
  int compiled = 0;
  fmt::print("{:>6} {:>12} {:>10} {:>6} {:>10}  {}\n", "M", "M class", "plan ms", "hit",
             "compile s", "config (dispatch)");
  for (const std::int64_t M : ms) {
    const Problem p = layer(M, 4096, 4096, Mode::train);
    const double t0 = wall_us();
    const Plan plan(p, o);
    const double plan_ms = (wall_us() - t0) / 1000.0;
    const MClass mc = m_class(M);
    classes.insert({mc.lo, mc.hi});
    total_ms += plan_ms;
    if (plan.compile_seconds() > 0) ++compiled;
    fmt::print("{:>6} {:>12} {:>10.2f} {:>6} {:>10.3f}  {} ({})\n", M,
               fmt::format("{}-{}", mc.lo, mc.hi), plan_ms, plan.cache_hit() ? "yes" : "no",
               plan.compile_seconds(), plan.config().key(), plan.dispatch());
    const std::string n = fmt::format("plan_loop.cold.M{}", M);
    c.report.add(n + ".wall", plan_ms, "ms");
    c.report.add(n + ".cache_hit", plan.cache_hit(), "bool");
    c.report.add(n + ".compile", plan.compile_seconds(), "s");
    c.report.add(n + ".config", plan.config().key(), "");
    c.report.add(n + ".m_class", fmt::format("{}-{}", mc.lo, mc.hi), "");
  }
  fmt::print("total {:.1f} ms; {} plans compiled (kernel sets), {} M classes\n", total_ms, compiled,
             classes.size());
  c.report.headline("1 plan loop: cold total (10 M)", total_ms, "ms", "", std::nullopt);
  c.report.headline("1 plan loop: kernel sets compiled", compiled, "",
                    fmt::format("<= {} (M classes)", classes.size()),
                    static_cast<std::size_t>(compiled) <= classes.size());

  constexpr int kReps = 100;
  fmt::print("hot (mean of {} constructions each):\n", kReps);
  double sum = 0;
  for (const std::int64_t M : ms) {
    const Problem p = layer(M, 4096, 4096, Mode::train);
    const double t0 = wall_us();
    for (int i = 0; i < kReps; ++i) {
      const Plan plan(p, o);
    }
    const double us = (wall_us() - t0) / kReps;
    sum += us;
    fmt::print("  M {:>5}: {:8.2f} us per plan\n", M, us);
    c.report.add(fmt::format("plan_loop.hot.M{}.wall", M), us, "us");
  }
  const double mean = sum / static_cast<double>(ms.size());
  c.report.headline("1 plan loop: hot plan mean wall", mean, "us", "<= 5 us", mean <= 5.0);

  // A further M never planned before, in a class already built: the dispatch runs (no compile,
  // no load). Without the plan's own workspace, whose cuMemAlloc the driver prices by size.
  PlanOptions nw = o;
  nw.allocate_workspace = false;
  double further = 0, worst = 0;
  constexpr int kFurther = 50;
  for (int i = 0; i < kFurther; ++i) {
    const Problem p = layer(300 + 11 * i, 4096, 4096, Mode::train);
    const double t0 = wall_us();
    const Plan plan(p, nw);
    const double us = wall_us() - t0;
    further += us;
    worst = std::max(worst, us);
    if (plan.compile_seconds() > 0) ++compiled;
  }
  fmt::print(
      "first plan of {} further M (300..839, no own workspace): mean {:.1f} us, worst "
      "{:.1f} us; kernel sets compiled so far {}\n",
      kFurther, further / kFurther, worst, compiled);
  c.report.headline("1 plan loop: further M, first plan (mean)", further / kFurther, "us",
                    "<= 50 us", further / kFurther <= 50.0);
}

// 2. Hot plan: construct + destroy with the kernels loaded.
void section_hot_plan(Context& c) {
  fmt::print("\n== 2. Hot plan (1000x4096x4096 bf16; kernels already loaded)\n");
  constexpr int kPlans = 10000;
  // Train twice: with the plan's own workspace (cuMemAlloc + cuMemFree per plan) and without
  // (PlanOptions::allocate_workspace = false: the caller passes one to run()).
  for (const int v : {0, 1, 2}) {
    const Mode mode = v == 2 ? Mode::eval : Mode::train;
    const Problem p = layer(1000, 4096, 4096, mode);
    PlanOptions o = c.options();
    o.allocate_workspace = v != 1;
    const Plan warm(p, o);  // keeps the kernel set loaded throughout
    fmt::print(
        "{}{}: config {} ({}), kernels [{}], workspace {} B, warm-up plan compile {:.3f} s\n",
        name(mode), v == 1 ? " (allocate_workspace = false)" : "", warm.config().key(),
        warm.dispatch(), join(warm.kernel_names()), warm.workspace_size(), warm.compile_seconds());
    for (int i = 0; i < 100; ++i) {
      const Plan q(p, o);
    }
    const double cpu0 = thread_cpu_us(), wall0 = wall_us();
    for (int i = 0; i < kPlans; ++i) {
      const Plan q(p, o);
    }
    const double cpu = (thread_cpu_us() - cpu0) / kPlans, wall = (wall_us() - wall0) / kPlans;
    fmt::print("  {} plans: {:.2f} us thread CPU, {:.2f} us wall per plan\n", kPlans, cpu, wall);
    const std::string n =
        fmt::format("2 hot plan {}{}: ", name(mode), v == 1 ? " no workspace" : "");
    c.report.headline(n + "CPU per plan", cpu, "us", "<= 5 us", cpu <= 5.0);
    c.report.headline(n + "wall per plan", wall, "us", "<= 5 us", wall <= 5.0);
  }
}

// CPU and wall microseconds per call of `run`: 10,000 calls in batches of 200, each batch
// enqueued back to back and timed without its synchronize.
std::pair<double, double> host_time_per_call(const Stream& stream,
                                             const std::function<void(CUstream)>& run) {
  constexpr int kBatch = 200, kBatches = 50;
  for (int i = 0; i < kBatch; ++i) run(stream.get());  // warm-up (first tensor-map encode, ...)
  stream.synchronize();
  double cpu = 0, wall = 0;
  for (int b = 0; b < kBatches; ++b) {
    const double cpu0 = thread_cpu_us(), wall0 = wall_us();
    for (int i = 0; i < kBatch; ++i) run(stream.get());
    cpu += thread_cpu_us() - cpu0;
    wall += wall_us() - wall0;
    stream.synchronize();
  }
  constexpr double calls = static_cast<double>(kBatch) * kBatches;
  return {cpu / calls, wall / calls};
}

// 0. The driver's own floor: what the calls a run makes cost the host, on a one-thread kernel
// (fj_bump) so that the GPU never holds the queue up.
void section_driver_floor(Context& c) {
  fmt::print(
      "\n== 0. Driver calls a run makes (host CPU per call; 10,000 calls, batches of 200)\n");
  Problem p = layer(64, 64, 64, Mode::train);
  p.momentum = std::nullopt;  // single-pass cumulative: the set has fj_bump
  const KernelConfig cfg = default_config(p, c.device);
  const auto core = plan_core(p, cfg, context_for(0), c.cache_dir);
  if (!core->bump) throw std::runtime_error("no fj_bump in " + cfg.key());
  DeviceBuffer counter(8);
  counter.fill_bytes(0);
  fj::Params prm{};
  prm.num_batches_tracked = counter.as<long long>();
  void* args[] = {&prm};
  const Driver& d = driver();
  CUlaunchAttribute pdl{};
  pdl.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  pdl.value.programmaticStreamSerializationAllowed = 1;
  auto ex = [&](CUstream s, unsigned attrs) {
    CUlaunchConfig lc{};
    lc.gridDimX = lc.gridDimY = lc.gridDimZ = 1;
    lc.blockDimX = lc.blockDimY = lc.blockDimZ = 1;
    lc.hStream = s;
    lc.attrs = &pdl;
    lc.numAttrs = attrs;
    check(d.cuLaunchKernelEx(&lc, core->bump, args, nullptr), "cuLaunchKernelEx");
  };
  const DeviceBuffer x(4096 * 64 * 2);
  struct Call {
    const char* what;
    std::function<void(CUstream)> fn;
  };
  const std::vector<Call> calls = {
      {"cuCtxGetCurrent",
       [&](CUstream) {
         CUcontext ctx;
         check(d.cuCtxGetCurrent(&ctx), "get");
       }},
      {"cuStreamGetCtx",
       [&](CUstream s) {
         CUcontext ctx;
         check(d.cuStreamGetCtx(s, &ctx), "ctx");
       }},
      {"cuLaunchKernel (1 thread)",
       [&](CUstream s) {
         check(d.cuLaunchKernel(core->bump, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr), "launch");
       }},
      {"cuLaunchKernelEx, no attribute", [&](CUstream s) { ex(s, 0); }},
      {"cuLaunchKernelEx, PDL attribute", [&](CUstream s) { ex(s, 1); }},
      {"cuTensorMapEncodeTiled (one map)", [&](CUstream) {
         (void)encode_tma_tile_map(DType::bf16, x.get(), 4096, 64, 64, 128, 64, "x");
       }}};
  for (const Call& k : calls) {
    const auto t = host_time_per_call(c.stream, k.fn);
    fmt::print("  {:<36} {:7.3f} us CPU, {:7.3f} us wall\n", k.what, t.first, t.second);
    c.report.headline(std::string("0 driver: ") + k.what, t.first, "us", "", std::nullopt);
  }
}

// 3. Host time per run.
void section_host_per_run(Context& c) {
  fmt::print("\n== 3. Host time per run (10,000 calls in batches of 200; synchronize excluded)\n");
  auto report = [&](const std::string& tag, std::pair<double, double> t, std::size_t kernels,
                    bool has_target) {
    fmt::print("  {:.2f} us thread CPU, {:.2f} us wall per call\n", t.first, t.second);
    const double target = kernels <= 1 ? 4.0 : 8.0;
    const std::string tgt = has_target ? fmt::format("<= {:.0f} us", target) : "";
    const std::optional<bool> pass_cpu =
        has_target ? std::optional<bool>(t.first <= target) : std::nullopt;
    const std::optional<bool> pass_wall =
        has_target ? std::optional<bool>(t.second <= target) : std::nullopt;
    c.report.headline("3 run " + tag + ": CPU per call", t.first, "us", tgt, pass_cpu);
    c.report.headline("3 run " + tag + ": wall per call", t.second, "us", tgt, pass_wall);
  };
  struct Case {
    std::string tag;
    Problem p;
  };
  const std::vector<Case> cases = {
      {"(a) 2048x4096x4096 train", layer(2048, 4096, 4096, Mode::train)},
      {"(b) 2048x4096x4096 eval", layer(2048, 4096, 4096, Mode::eval)},
      {"(c) 1000x4096x4096 train", layer(1000, 4096, 4096, Mode::train)}};
  for (const Case& k : cases) {
    try {
      fmt::print("{} {}:\n", k.tag.substr(0, 3), label(k.p));
      const Inputs in(k.p, 1);
      const Plan plan(k.p, c.options());
      const std::vector<std::string> kernels = plan.kernel_names();
      fmt::print("  config {} ({}), {} kernel{}: [{}]\n", plan.config().key(), plan.dispatch(),
                 kernels.size(), kernels.size() == 1 ? "" : "s", join(kernels));
      c.report.add("3 run " + k.tag + ": kernels", kernels, "");
      const Tensors t = in.tensors[0];
      report(k.tag, host_time_per_call(c.stream, [&](CUstream s) { plan.run(s, t); }),
             kernels.size(), true);
    } catch (const std::exception& e) {
      c.report.error("3 run " + k.tag, e.what());
    }
    c.report.save();
  }
  const std::string tag_d = "(d) M=4096 plan, rows 2048/2047 train";
  try {
    const Problem p = layer(4096, 4096, 4096, Mode::train);
    fmt::print("(d) {} running rows 2048 and 2047 in turn:\n", label(p));
    const Inputs in(p, 1);
    const Plan plan(p, c.options());
    const std::vector<std::string> kernels = plan.kernel_names();
    fmt::print("  config {} ({}), {} kernels: [{}]\n", plan.config().key(), plan.dispatch(),
               kernels.size(), join(kernels));
    const Tensors t = in.tensors[0];
    std::int64_t call = 0;
    report(tag_d,
           host_time_per_call(c.stream,
                              [&](CUstream s) {
                                plan.run(s, t,
                                         (call++ & 1) ? std::int64_t{2047} : std::int64_t{2048});
                              }),
           kernels.size(), true);
  } catch (const std::exception& e) {
    c.report.error("3 run " + tag_d, e.what());
  }
  c.report.save();
  const std::string tag_e = "(e) cuBLASLt GEMM 2048x4096x4096";
  try {
    const Problem p = layer(2048, 4096, 4096, Mode::eval);
    fmt::print("(e) bare cuBLASLt GEMM {}x{}x{} bf16:\n", p.M, p.N, p.K);
    const Inputs in(p, 1);
    const BareGemm gemm(p, 0);
    fmt::print("  {}\n", gemm.description());
    const Tensors t = in.tensors[0];
    report(tag_e, host_time_per_call(c.stream, [&](CUstream s) { gemm.run(s, t.x, t.w, t.y); }), 1,
           false);
  } catch (const std::exception& e) {
    c.report.error("3 run " + tag_e, e.what());
  }
}

// 4. A small layer end to end: is it host- or GPU-bound?
void section_small_layer(Context& c) {
  constexpr int kRuns = 1000;
  const Problem p = layer(128, 512, 1024, Mode::train);
  fmt::print("\n== 4. Small layer end to end ({}, {} back-to-back runs)\n", label(p), kRuns);
  const Inputs in(p, 1);
  const Plan plan(p, c.options());
  fmt::print("config {} ({}), kernels [{}]\n", plan.config().key(), plan.dispatch(),
             join(plan.kernel_names()));
  const Tensors t = in.tensors[0];
  for (int i = 0; i < 50; ++i) plan.run(c.stream, t);
  c.stream.synchronize();
  const Event start, end;
  const double wall0 = wall_us();
  start.record(c.stream);
  const double cpu0 = thread_cpu_us();
  for (int i = 0; i < kRuns; ++i) plan.run(c.stream, t);
  const double cpu = (thread_cpu_us() - cpu0) / kRuns;
  end.record(c.stream);
  c.stream.synchronize();
  const double wall = (wall_us() - wall0) / kRuns;
  const double gpu = static_cast<double>(Event::elapsed_ms(start, end)) * 1000.0 / kRuns;
  const std::string verdict = gpu >= cpu ? "GPU-bound" : "host-bound";
  fmt::print("wall {:.2f} us, thread CPU {:.2f} us, GPU {:.2f} us per call: {}\n", wall, cpu, gpu,
             verdict);
  c.report.headline("4 small layer: wall per call", wall, "us", "", std::nullopt);
  c.report.headline("4 small layer: CPU per call", cpu, "us", "", std::nullopt);
  c.report.headline("4 small layer: GPU per call", gpu, "us", "", std::nullopt);
  c.report.headline_text("4 small layer: verdict", verdict);
}

// The heuristic's plan for `p` and its config forced twice: M at run time, M compiled in.
struct DynamicAndExact {
  Plan heuristic, dynamic, exact;
};
DynamicAndExact dynamic_and_exact(const Problem& p, const PlanOptions& o) {
  Plan heuristic(p, o);
  KernelConfig k = heuristic.config();
  PlanOptions f = o;
  k.exact_m = false;
  f.config = k;
  Plan d(p, f);
  k.exact_m = true;
  f.config = k;
  return {std::move(heuristic), std::move(d), Plan(p, f)};
}

// 5. Dynamic-M kernels against the same config compiled for the exact M.
void section_dynamic_vs_exact(Context& c) {
  constexpr int kWarmupEach = 5, kRunsEach = 20;
  std::vector<Problem> problems;
  const std::vector<std::array<std::int64_t, 3>> shapes =
      c.quick ? std::vector<std::array<std::int64_t, 3>>{{128, 512, 1024}, {4096, 4096, 4096}}
              : std::vector<std::array<std::int64_t, 3>>{
                    {1024, 8192, 8192}, {16384, 4096, 4096}, {4096, 4096, 4096}, {128, 512, 1024}};
  for (const auto& s : shapes)
    for (const Mode mode : {Mode::train, Mode::eval})
      problems.push_back(layer(s[0], s[1], s[2], mode));
  fmt::print(
      "\n== 5. Dynamic vs exact-M kernels (heuristic config; median of {} runs each after {} "
      "warm-ups each;\n   runs interleaved d, x, d, x back to back on one stream, EventTimer per "
      "run; L2: inputs\n   rotate over timing_input_sets(2..3) device copies, each plan's k-th "
      "run reads set k mod sets)\n",
      kRunsEach, kWarmupEach);

  // Compile every kernel set first, in parallel (NVRTC is the slow part; plans are
  // thread-safe and share kernel sets through the in-process cache).
  const PlanOptions o = c.options();
  {
    std::vector<std::future<std::string>> builds;
    for (const Problem& p : problems)
      builds.push_back(std::async(std::launch::async, [p, o]() -> std::string {
        try {
          (void)dynamic_and_exact(p, o);
          return {};
        } catch (const std::exception& e) {
          return e.what();
        }
      }));
    const double t0 = wall_us();
    for (std::size_t i = 0; i < builds.size(); ++i)
      if (const std::string e = builds[i].get(); !e.empty())
        fmt::print("  build {} failed: {}\n", label(problems[i]), e);
    fmt::print("kernel sets built in parallel in {:.1f} s\n", (wall_us() - t0) / 1e6);
  }

  fmt::print("{:<28} {:>4} {:>11} {:>11} {:>8}  {}\n", "problem", "sets", "dynamic ms", "exact ms",
             "d/x", "config (dispatch)");
  for (const Problem& p : problems) {
    const std::string tag = "5 dyn/exact " + label(p);
    try {
      // Named, not structured bindings: clang 14 (the sanitizer builds) cannot capture those.
      const DynamicAndExact plans = dynamic_and_exact(p, o);
      const Plan &heuristic = plans.heuristic, &d = plans.dynamic, &x = plans.exact;
      const double set_bytes = static_cast<double>(storage_bytes(p.dtype)) *
                               static_cast<double>(p.M * p.K + p.N * p.K + p.M * p.N);
      const int sets = timing_input_sets(set_bytes, c.device, 2, 3);
      const Inputs in(p, sets);
      EventTimer timer(c.stream.get(), 2 * kRunsEach);
      int call = 0;
      auto run = [&](int, CUstream s) {
        const auto set = static_cast<std::size_t>((call / 2) % sets);
        (call % 2 ? x : d).run(s, in.tensors[set]);
        ++call;
      };
      std::vector<double> times;
      timer.time(run, 1, 2 * kWarmupEach, 2 * kRunsEach, times);
      std::vector<double> td, tx;
      for (std::size_t i = 0; i < times.size(); ++i) (i % 2 ? tx : td).push_back(times[i]);
      const double md = median(td), mx = median(tx), ratio = md / mx;
      fmt::print("{:<28} {:>4} {:>11.4f} {:>11.4f} {:>8.4f}  {} ({})\n", label(p), sets, md, mx,
                 ratio, heuristic.config().key(), heuristic.dispatch());
      c.report.add(tag + ": dynamic", md, "ms");
      c.report.add(tag + ": exact", mx, "ms");
      c.report.add(tag + ": config", d.config().key(), "");
      c.report.headline(tag + ": d/x", ratio, "", "<= 1.02", ratio <= 1.02);
    } catch (const std::exception& e) {
      c.report.error(tag, e.what());
    }
    c.report.save();
  }
}

// 6. A bounded kernel-set cache under churn: memory must stay flat once every layer was seen.
void section_soak(Context& c) {
  constexpr int kPlans = 2000;
  const std::vector<std::int64_t> ns = {256, 320, 384, 448, 512, 576, 640, 704};
  fmt::print(
      "\n== 6. Bounded memory soak (max_kernel_sets 4; {} plans over {} layers 512xNx256 bf16 "
      "eval, each run once)\n",
      kPlans, ns.size());
  std::vector<Problem> layers;
  std::vector<std::unique_ptr<Inputs>> inputs;
  for (const std::int64_t n : ns) {
    layers.push_back(layer(512, n, 256, Mode::eval));
    inputs.push_back(std::make_unique<Inputs>(layers.back(), 1));
  }
  PlanOptions o = c.options();
  o.max_kernel_sets = 4;
  struct Snapshot {
    std::size_t modules, live;
    double rss, gpu_free;
  };
  auto snap = [&](const char* when) {
    c.stream.synchronize();
    const Snapshot s{Module::loaded_count(), Module::live_count(), rss_mib(), gpu_free_mib()};
    fmt::print("{:<18} modules cached {:>3}, loaded {:>3}, RSS {:8.1f} MiB, GPU free {:9.1f} MiB\n",
               when, s.modules, s.live, s.rss, s.gpu_free);
    const std::string n = fmt::format("6 soak {}", when);
    c.report.add(n + ": modules", s.modules, "");
    c.report.add(n + ": rss", s.rss, "MiB");
    c.report.add(n + ": gpu_free", s.gpu_free, "MiB");
    return s;
  };
  const Snapshot start = snap("start");
  Snapshot first{};
  int compiled = 0;
  const double t0 = wall_us();
  double t_first = t0;
  for (int i = 0; i < kPlans; ++i) {
    const std::size_t l = static_cast<std::size_t>(i) % layers.size();
    {
      const Plan plan(layers[l], o);
      if (plan.compile_seconds() > 0) ++compiled;
      plan.run(c.stream, inputs[l]->tensors[0]);
      // The plan may hold the last reference to its module: let its run finish first.
      c.stream.synchronize();
    }
    if (static_cast<std::size_t>(i) + 1 == layers.size()) {
      first = snap("after first pass");
      t_first = wall_us();
    }
  }
  const double per_plan_ms =
      (wall_us() - t_first) / (kPlans - static_cast<double>(layers.size())) / 1000.0;
  const Snapshot end = snap("end");
  Module::set_max_loaded(0);  // back to the default bound
  const double rss_growth = end.rss - first.rss, gpu_drop = first.gpu_free - end.gpu_free;
  fmt::print(
      "{} plans compiled; after the first pass {:.3f} ms per plan+run; RSS growth {:.1f} MiB, GPU "
      "free drop {:.1f} MiB (start->first pass: RSS {:+.1f}, GPU free {:+.1f} MiB)\n",
      compiled, per_plan_ms, rss_growth, gpu_drop, first.rss - start.rss,
      first.gpu_free - start.gpu_free);
  c.report.add("6 soak: plans compiled", compiled, "");
  c.report.headline("6 soak: plan+run after first pass", per_plan_ms, "ms", "", std::nullopt);
  c.report.headline("6 soak: modules cached at end", static_cast<double>(end.modules), "", "<= 4",
                    end.modules <= 4);
  // Three bounded holders (module cache, cores, plan recipes), each least recently used first.
  c.report.headline("6 soak: modules loaded at end", static_cast<double>(end.live), "", "<= 12",
                    end.live <= 12);
  c.report.headline("6 soak: RSS growth after first pass", rss_growth, "MiB", "< 64 MiB",
                    rss_growth < 64.0);
  c.report.headline("6 soak: GPU free drop after first pass", gpu_drop, "MiB", "< 64 MiB",
                    gpu_drop < 64.0);
}

int usage(const char* argv0, int rc) {
  fmt::print(rc ? stderr : stdout, "usage: {} [--quick] [--only 0123456] [--out FILE.json]\n",
             argv0);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up live through `tee`
  bool quick = false;
  std::string out, only;  // --only 0,2,3: run these sections alone
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--help" || a == "-h") {
      return usage(argv[0], 0);
    } else {
      return usage(argv[0], 2);
    }
  }
  Report report(out);
  try {
    primary_context(0);
    const Device device = Device::get(0);
    const Stream stream;
    const TempDir cache;
    fmt::print("device: {} ({}), {} SMs, {} MiB L2, driver {}; cache dir {}{}\n", device.name,
               device.arch(), device.sm_count, device.l2_bytes >> 20, device.driver_version,
               cache.path(), quick ? "; --quick" : "");
    report.set_info("device", device.name);
    report.set_info("arch", device.arch());
    report.set_info("driver", device.driver_version);
    report.set_info("quick", quick);
    Context c{report, device, stream, cache.path(), quick};
    const double t0 = wall_us();
    auto section = [&](const char* what, void (*fn)(Context&)) {
      if (!only.empty() && only.find(what[0]) == std::string::npos) return;
      const double s0 = wall_us();
      try {
        fn(c);
      } catch (const std::exception& e) {
        report.error(what, e.what());
      }
      fmt::print("({} took {:.1f} s)\n", what, (wall_us() - s0) / 1e6);
      report.save();
    };
    section("0 driver floor", section_driver_floor);
    section("1 planning loop", section_planning);
    section("2 hot plan", section_hot_plan);
    section("3 host time per run", section_host_per_run);
    section("4 small layer", section_small_layer);
    section("5 dynamic vs exact", section_dynamic_vs_exact);
    section("6 soak", section_soak);
    fmt::print("\ntotal {:.1f} s\n", (wall_us() - t0) / 1e6);
  } catch (const std::exception& e) {
    report.error("setup", e.what());
  }
  report.save();
  report.print_summary();
  if (!out.empty()) fmt::print("measurements: {}\n", out);
  return report.failed() ? 1 : 0;
}
