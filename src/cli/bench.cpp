// fusejit bench: times the fused op, the bare cuBLASLt GEMM of the same shape and dtype (the
// floor a fused op approaches) and the reference op (cuBLASLt + plain BatchNorm kernels), each
// as the median of per-run CUDA-event timings after warm-up, on random data.
#include <fmt/format.h>

#include <chrono>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/problem_options.hpp"
#include "cli/verbs.hpp"
#include "fusejit/backward.hpp"
#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "tools/sweep.hpp"

namespace fusejit::cli {

namespace {

struct BenchArgs {
  ProblemOptions problem;
  std::string variant = "auto";
  std::string config;  // a KernelConfig key: forces that config (overrides --variant)
  int runs = 100;
  int warmup = 10;
  int device = 0;
  std::string cache_dir;
  bool json = false;
  bool backward = false;
  std::string backward_config;  // "dx.<key>.dw.<key>": forces the gradient GEMMs' tiles
};

struct SystemTiming {
  std::string system;  // fused | gemm | reference
  std::string detail;  // config, algorithm or description
  std::vector<std::string> kernels;
  std::optional<double> ms;  // median; empty when the system could not run
  double min_ms = 0;
  std::string error;
};

// At least two input sets and up to 32: bench times few systems and can afford the memory.
int input_set_count(const Problem& p, const Device& dev) {
  const double set_bytes = static_cast<double>(storage_bytes(p.dtype)) *
                           static_cast<double>(p.M * p.K + p.N * p.K + p.M * p.N);
  return timing_input_sets(set_bytes, dev, 2, 32);
}

// Median and minimum of `runs` back-to-back runs of run(set, stream), after `warmup` runs, timed
// as the tuner times its candidates (device/event_timer.hpp).
template <class Run>
std::pair<double, double> time_ms(const Stream& stream, int sets, int warmup, int runs, Run run) {
  EventTimer timer(stream.get(), runs);
  std::vector<double> t;
  timer.time(run, sets, warmup, runs, t);
  return {median(t), *std::min_element(t.begin(), t.end())};
}

double tflops(const Problem& p, double ms) {
  return 2.0 * static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K) /
         (ms * 1e-3) / 1e12;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The fused op's plan options: --variant and --config force its (forward) kernels.
PlanOptions fused_plan_options(const BenchArgs& a) {
  PlanOptions o;
  o.device = a.device;
  o.cache_dir = a.cache_dir;
  if (a.variant != "auto") o.variant = parse_variant(a.variant);
  if (!a.config.empty()) o.config = KernelConfig::parse(a.config);
  return o;
}

nlohmann::json bench_problem(const BenchArgs& a, const Problem& p, const Device& dev) {
  const Stream stream;
  SweepCase c;
  c.problem = p;
  c.distribution = Distribution::non_centred;  // as KernelBench draws x
  const CaseInputs in = make_case_inputs(c);
  const int sets = input_set_count(p, dev);
  std::vector<DeviceCase> data;
  data.reserve(static_cast<std::size_t>(sets));
  for (int i = 0; i < sets; ++i) data.emplace_back(in);
  std::vector<Tensors> tensors;
  for (const auto& d : data) tensors.push_back(d.tensors());

  std::vector<SystemTiming> rows;
  auto measure = [&](SystemTiming row, auto&& make) {
    try {
      auto run = make(row);
      const auto [median, best] = time_ms(stream, sets, a.warmup, a.runs, run);
      row.ms = median;
      row.min_ms = best;
    } catch (const std::exception& e) {
      row.error = e.what();
    }
    rows.push_back(std::move(row));
  };
  // Each system is kept alive by the lambda it returns.
  measure({"fused"}, [&](SystemTiming& row) {
    const PlanOptions o = fused_plan_options(a);
    // Plan creation time as a user sees it: cold (NVRTC) or warm (disk cache + module load).
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = std::make_shared<Plan>(p, o);
    const double plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    row.detail =
        fmt::format("{} (plan {:.1f} ms, {}, chosen by {})",
                    plan->uses_reference() ? "cuBLASLt reference path" : plan->config().key(),
                    plan_ms, plan->cache_hit() ? "cache hit" : "compiled", plan->dispatch());
    row.kernels = plan->kernel_names();
    return [plan, &tensors](int set, CUstream s) { plan->run(s, tensors[set]); };
  });
  measure({"gemm"}, [&](SystemTiming& row) {
    auto gemm = std::make_shared<BareGemm>(p, a.device);
    row.detail = gemm->description();
    row.kernels = {"cublasLtMatmul"};
    return [gemm, &tensors](int set, CUstream s) {
      gemm->run(s, tensors[set].x, tensors[set].w, tensors[set].y);
    };
  });
  measure({"reference"}, [&](SystemTiming& row) {
    ReferenceOpOptions o;
    o.device = a.device;
    o.cache_dir = a.cache_dir;
    auto ref = std::make_shared<ReferenceOp>(p, o);
    row.detail = ref->description();
    row.kernels = ref->kernel_names();
    return [ref, &tensors](int set, CUstream s) { ref->run(s, tensors[set]); };
  });
  stream.synchronize();

  std::optional<double> gemm_ms;
  for (const auto& r : rows)
    if (r.system == "gemm") gemm_ms = r.ms;
  nlohmann::json j;
  j["problem"] = p.key();
  j["shape"] = format_shape(p.shape());
  j["dtype"] = name(p.dtype);
  j["mode"] = name(p.mode);
  j["param_dtype"] = name(p.param_dtype);
  j["runs"] = a.runs;
  j["warmup"] = a.warmup;
  j["input_sets"] = sets;
  j["systems"] = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json s;
    s["system"] = r.system;
    s["detail"] = r.detail;
    s["kernels"] = r.kernels;
    if (r.ms) {
      s["ms"] = *r.ms;
      s["min_ms"] = r.min_ms;
      s["tflops"] = tflops(p, *r.ms);
      s["vs_gemm"] = gemm_ms ? nlohmann::json(*r.ms / *gemm_ms) : nlohmann::json(nullptr);
    } else {
      s["error"] = r.error;
    }
    j["systems"].push_back(std::move(s));
  }
  if (!a.json) {
    fmt::print(
        "\n{} {} {} (params {}, momentum {}): median of {} runs after {} warm-up, {} input "
        "set{}\n",
        format_shape(p.shape()), name(p.dtype), name(p.mode), name(p.param_dtype),
        p.momentum ? fmt::format("{}", *p.momentum) : std::string("none"), a.runs, a.warmup, sets,
        sets == 1 ? "" : "s");
    fmt::print("{:<10} {:>10} {:>10} {:>9}  {}\n", "system", "ms", "TFLOP/s", "vs GEMM", "detail");
    for (const auto& r : rows) {
      if (!r.ms) {
        fmt::print("{:<10} {:>10} {:>10} {:>9}  error: {}\n", r.system, "-", "-", "-", r.error);
        continue;
      }
      fmt::print("{:<10} {:>10.4f} {:>10.1f} {:>9}  {} [{}]\n", r.system, *r.ms, tflops(p, *r.ms),
                 gemm_ms ? fmt::format("{:.3f}", *r.ms / *gemm_ms) : std::string("-"), r.detail,
                 join(r.kernels));
    }
  }
  return j;
}

// --backward: a training step's layer (forward saving what backward needs, then every gradient)
// against the floor of its three GEMMs, each timed alone as cuBLASLt runs it: y = x W^T (M x N,
// reduction K), dx = dy W (M x K, reduction N) and dW = dy^T x (N x K, reduction M). The two
// backward GEMMs are timed as TN GEMMs of their shapes (cuBLASLt's other layouts run within a few
// percent of TN at these sizes), on one input set each.
nlohmann::json bench_backward(const BenchArgs& a, const Problem& p, const Device& dev) {
  const Stream stream;
  SweepCase c;
  c.problem = p;
  c.distribution = Distribution::non_centred;
  const CaseInputs in = make_case_inputs(c);
  const int sets = input_set_count(p, dev);
  const DType st = storage_type(p.dtype), pd = storage_type(p.param_dtype);
  const auto es = storage_bytes(st);
  const auto ps = storage_bytes(pd);
  struct Set {
    DeviceCase data;
    DeviceBuffer saved, dy, dx, dw, dbias, dscale, dgamma, dbeta;
    Tensors t;
    BackwardTensors b;
  };
  std::vector<std::unique_ptr<Set>> data;
  HostTensor dy(st, static_cast<std::size_t>(p.M * p.lda_y()));
  fill_normal(dy, 0.0, 1.0);
  for (int i = 0; i < sets; ++i) {
    auto s = std::make_unique<Set>(Set{DeviceCase(in),
                                       DeviceBuffer(p.M * p.lda_y() * es),
                                       DeviceBuffer(dy.bytes()),
                                       DeviceBuffer(p.M * p.lda_x() * es),
                                       DeviceBuffer(p.N * p.lda_w() * es),
                                       DeviceBuffer(p.N * ps),
                                       DeviceBuffer(p.N * ps),
                                       DeviceBuffer(p.N * ps),
                                       DeviceBuffer(p.N * ps),
                                       {},
                                       {}});
    s->dy.upload(dy.data(), dy.bytes());
    s->t = s->data.tensors();
    s->t.saved = s->saved.get();
    BackwardTensors& b = s->b;
    b.dy = s->dy.get();
    b.x = s->t.x;
    b.w = s->t.w;
    b.saved = s->saved.get();
    b.scale = s->t.scale;
    b.gamma = s->t.gamma;
    if (p.mode == Mode::eval) {
      b.running_mean = s->t.running_mean;
      b.running_var = s->t.running_var;
    } else {
      b.save_mean = s->t.save_mean;
      b.save_invstd = s->t.save_invstd;
    }
    b.dx = s->dx.get();
    b.dw = s->dw.get();
    if (p.has_bias) b.dbias = s->dbias.get();
    if (p.has_scale) b.dscale = s->dscale.get();
    if (p.has_affine) {
      b.dgamma = s->dgamma.get();
      b.dbeta = s->dbeta.get();
    }
    data.push_back(std::move(s));
  }
  const Plan forward(p, fused_plan_options(a));
  BackwardOptions bo;
  bo.device = a.device;
  bo.cache_dir = a.cache_dir;
  if (!a.backward_config.empty()) {
    force_backward_config(bo, BackwardConfig::parse(a.backward_config));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const BackwardPlan backward(p, bo);
  const double plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The floor's GEMMs (rows, cols, reduction) on the step's own random operands, read as TN
  // operands of their shapes (x, W and dy hold at least M K, N K and M N elements): a GEMM's
  // power, and so the clock it holds under the power limit, depends on the data it multiplies.
  // Constant operands (the first version) ran cuBLASLt's kernel at 1.78 GHz where ours, on
  // random data, ran at 1.62 (H200, ncu, 4096^3 bf16).
  const Set& first = *data.front();
  struct FloorGemm {
    BareGemm gemm;
    DeviceBuffer y;
    const void* lhs;
    const void* rhs;
  };
  auto floor_gemm = [&](std::int64_t m, std::int64_t n, std::int64_t k, const void* lhs,
                        const void* rhs) {
    Problem g;
    g.M = m;
    g.N = n;
    g.K = k;
    g.dtype = p.dtype;
    g.mode = Mode::eval;
    return std::make_unique<FloorGemm>(FloorGemm{
        BareGemm(g, a.device), DeviceBuffer(static_cast<std::size_t>(m * n) * es), lhs, rhs});
  };
  const auto gemm_fwd = floor_gemm(p.M, p.N, p.K, first.t.x, first.t.w);
  const auto gemm_dx = floor_gemm(p.M, p.K, p.N, first.b.dy, first.t.w);
  const auto gemm_dw = floor_gemm(p.N, p.K, p.M, first.b.dy, first.t.x);
  // Every system once per round in rotating order, the median over all rounds' runs: timed one
  // after another, a system ran up to 12% slower after the floor's random-operand GEMMs than
  // before them (H200: the clock under the power limit follows what ran just before).
  struct System {
    int sets;
    std::function<void(int, CUstream)> run;
    std::vector<double> times;
  };
  auto floor_run = [](const FloorGemm& f) {
    return [&f](int, CUstream s) { f.gemm.run(s, f.lhs, f.rhs, f.y.get()); };
  };
  std::vector<System> systems = {
      {1, floor_run(*gemm_fwd), {}},
      {1, floor_run(*gemm_dx), {}},
      {1, floor_run(*gemm_dw), {}},
      {sets, [&](int i, CUstream s) { forward.run(s, data[i]->t); }, {}},
      {sets, [&](int i, CUstream s) { backward.run(s, data[i]->b); }, {}},
      {sets,
       [&](int i, CUstream s) {
         forward.run(s, data[i]->t);
         backward.run(s, data[i]->b);
       },
       {}}};
  // Every set's saved tensor and statistics written before any backward reads them (the
  // rounds rotate, so the backward may run before the forward has visited every set).
  for (int i = 0; i < sets; ++i) forward.run(stream.get(), data[static_cast<std::size_t>(i)]->t);
  const ResidentGridCounts resident_before = resident_grid_counts();
  constexpr int kRounds = 5;
  const int per_round = std::max(1, (a.runs + kRounds - 1) / kRounds);
  EventTimer timer(stream.get(), per_round);
  for (int r = 0; r < kRounds; ++r)
    for (std::size_t i = 0; i < systems.size(); ++i) {
      System& sys = systems[(i + static_cast<std::size_t>(r)) % systems.size()];
      timer.time(sys.run, sys.sets, r == 0 ? a.warmup : 1, per_round, sys.times);
    }
  const double g_fwd = median(systems[0].times), g_dx = median(systems[1].times),
               g_dw = median(systems[2].times), fwd = median(systems[3].times),
               bwd = median(systems[4].times), step = median(systems[5].times);
  stream.synchronize();
  const double floor3 = g_fwd + g_dx + g_dw, floor2 = g_dx + g_dw;
  // The BatchNorm passes the backward runs of the timing (warm-up included) took, as launched.
  const ResidentGridCounts resident_after = resident_grid_counts();
  const std::uint64_t launched = resident_after.launched - resident_before.launched,
                      refused = resident_after.refused - resident_before.refused,
                      shared = resident_after.shared - resident_before.shared;
  std::string passes = p.mode == Mode::eval ? "fj_bwd_reduce, fj_bwd_params"
                                            : "fj_bwd_reduce, fj_bwd_coef, fj_bwd_da";
  const char* resident = shared == 0          ? "fj_bwd_resident"
                         : shared == launched ? "fj_bwd_resident_shared"
                                              : "fj_bwd_resident or fj_bwd_resident_shared";
  if (refused > 0)
    passes = fmt::format(
        "{} in {} runs, the three passes in {} (its cooperative "
        "launch refused)",
        resident, launched, refused);
  else if (launched > 0)
    passes = resident;
  nlohmann::json j;
  j["batchnorm_passes"] = passes;
  j["problem"] = p.key();
  j["shape"] = format_shape(p.shape());
  j["backward_config"] = backward.config_key();
  j["backward_dispatch"] = backward.dispatch();
  j["backward_kernels"] = backward.kernel_names();
  j["forward_config"] = forward.uses_reference() ? "reference" : forward.config().key();
  j["gemm_ms"] = {{"forward", g_fwd}, {"dx", g_dx}, {"dw", g_dw}};
  j["forward_ms"] = fwd;
  j["backward_ms"] = bwd;
  j["step_ms"] = step;
  j["step_vs_3gemm"] = step / floor3;
  j["backward_vs_2gemm"] = bwd / floor2;
  if (!a.json) {
    fmt::print(
        "\n{} {} {} backward: median of {} runs in {} rounds (every system once per round, in "
        "rotating order) after {} warm-up, {} input set{}\n",
        format_shape(p.shape()), name(p.dtype), name(p.mode), kRounds * per_round, kRounds,
        a.warmup, sets, sets == 1 ? "" : "s");
    fmt::print("  forward {} [{}]\n  backward {} ({}) [{}] (plan {:.1f} ms, {})\n",
               forward.uses_reference() ? "cuBLASLt reference path" : forward.config().key(),
               join(forward.kernel_names()), backward.config_key(), backward.dispatch(),
               join(backward.kernel_names()), plan_ms,
               backward.cache_hit() ? "cache hit" : "compiled");
    fmt::print("  batchnorm passes: {}\n", passes);
    fmt::print("{:<26} {:>10} {:>10}\n", "system", "ms", "vs floor");
    fmt::print("{:<26} {:>10.4f} {:>10.3f}\n", "fused forward + backward", step, step / floor3);
    fmt::print("{:<26} {:>10.4f} {:>10.3f}\n", "fused backward", bwd, bwd / floor2);
    fmt::print("{:<26} {:>10.4f} {:>10.3f}\n", "fused forward (saving)", fwd, fwd / g_fwd);
    fmt::print("{:<26} {:>10.4f}  (GEMMs {:.4f} + {:.4f} + {:.4f})\n", "3-GEMM floor (cuBLASLt)",
               floor3, g_fwd, g_dx, g_dw);
  }
  return j;
}

int run_bench(const BenchArgs& a) {
  if (a.variant != "auto") parse_variant(a.variant);
  const std::vector<Problem> problems = a.problem.problems();
  primary_context(a.device);
  const Device dev = Device::get(a.device);
  if (!a.json)
    fmt::print("device: {} ({}), {} SMs, {} MiB L2\n", dev.name, dev.arch(), dev.sm_count,
               dev.l2_bytes >> 20);
  nlohmann::json out;
  out["device"] = {{"name", dev.name},
                   {"arch", dev.arch()},
                   {"sm_count", dev.sm_count},
                   {"l2_bytes", dev.l2_bytes},
                   {"driver", dev.driver_version}};
  out["results"] = nlohmann::json::array();
  bool failed = false;
  for (const Problem& p : problems) {
    if (a.backward) {
      out["results"].push_back(bench_backward(a, p, dev));
      continue;
    }
    nlohmann::json r = bench_problem(a, p, dev);
    for (const auto& s : r["systems"]) failed |= s.contains("error");
    out["results"].push_back(std::move(r));
  }
  if (a.json) fmt::print("{}\n", out.dump(2));
  return failed ? 1 : 0;
}

}  // namespace

void add_bench(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "bench", "Time the fused op against the bare cuBLASLt GEMM and the reference op");
  auto a = std::make_shared<BenchArgs>();
  a->problem.add_to(*cmd, true);
  cmd->add_option("--variant", a->variant,
                  "Fused op (with --backward: its forward): auto, tiled or warpspec")
      ->capture_default_str();
  cmd->add_option("--config", a->config,
                  "Fused op (with --backward: its forward): this kernel config (a key as "
                  "`fusejit bench` prints it)");
  cmd->add_option("--runs", a->runs, "Timed runs per system (median reported)")
      ->check(CLI::Range(50, 1000000))
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed runs first")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "GPU ordinal")->capture_default_str();
  cmd->add_option("--cache-dir", a->cache_dir, "Kernel cache directory (default: see README)");
  cmd->add_flag("--backward", a->backward,
                "Time a training step's layer (forward saving + backward) against its 3 GEMMs");
  cmd->add_option("--backward-config", a->backward_config,
                  "With --backward: the gradient GEMMs' tiles, dx.<config key>.dw.<config key>");
  cmd->add_flag("--json", a->json, "Print the results as JSON instead of a table");
  cmd->callback([&action, a] { action = [a] { return run_bench(*a); }; });
}

}  // namespace fusejit::cli
