#include "fusejit/tune/tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/tune/measure.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/verify/cpu_reference.hpp"
#include "fusejit/verify/verification.hpp"

namespace fusejit {

namespace {

using Clock = std::chrono::steady_clock;
using Status = CandidateOutcome::Status;

// One contender: a fused config or the reference op, and what became of it.
struct Contender {
  std::optional<KernelConfig> config;  // nullopt: the cuBLASLt reference op
  // A fused candidate: its kernels (shared with any Plan of the same config) and a workspace.
  std::shared_ptr<const PlanCore> core;
  RunShape shape;
  DeviceBuffer workspace;
  std::unique_ptr<ReferenceOp> reference;
  CandidateOutcome out;

  bool built() const { return core || reference; }
  void run(CUstream s, const Tensors& t) const {
    if (core)
      launch(*core, shape, s, t, workspace.get());
    else
      reference->run(s, t);
  }
};

std::vector<Contender> contenders(const Problem& p, const Device& d, bool include_reference) {
  const std::vector<KernelConfig> cs = candidate_configs(p, d);
  std::vector<Contender> out;
  auto add = [&](std::optional<KernelConfig> c) {
    Contender k;
    k.out.key = c ? c->key() : std::string(kReferenceCandidate);
    k.config = std::move(c);
    out.push_back(std::move(k));
  };
  // The heuristic's pick (ranked at its M class, see default_config) first and the reference
  // next: early exit needs a good "best so far" early, and these two are the likeliest.
  std::optional<KernelConfig> heuristic;
  if (!cs.empty()) heuristic = default_config(p, d);
  if (heuristic) add(heuristic);
  if (include_reference) add(std::nullopt);
  for (const KernelConfig& c : cs)
    if (c.key() != heuristic->key()) add(c);
  // The heuristic's config compiled for this exact M (KernelConfig::exact_m): a constant M
  // saves a few instructions, which the tuner may find worth a kernel set of its own. On H100
  // dynamic kernels measured within 0.6% of exact ones on large shapes and 3-4.5% slower on a
  // 7-10 us layer (docs/performance.md): one twin, of the likeliest winner, not one per
  // candidate.
  if (heuristic) {
    heuristic->exact_m = true;
    add(heuristic);
  }
  return out;
}

KernelSource contender_source(const Problem& p, const std::optional<KernelConfig>& config) {
  return config ? generate(p, *config) : reference_kernel_source(p.dtype, p.param_dtype);
}

// At most 8 input sets: the tuner times many candidates and must stay within seconds.
int input_sets(const Problem& p, const Device& d) {
  const double set_bytes = static_cast<double>(storage_bytes(p.dtype)) *
                           static_cast<double>(p.M * p.lda_x() + p.N * p.lda_w() + p.M * p.lda_y());
  return timing_input_sets(set_bytes, d, 1, 8);
}

// The float64 reference for a subset of columns: inputs restricted to those columns of W and
// the per-column parameters (x whole), run through the same reference the sweep uses.
struct ColumnCheck {
  std::vector<std::int64_t> cols;
  CaseInputs sub;  // the inputs restricted to `cols` (N = cols.size())
  ReferenceOutputs ref;
};

HostTensor pick(const HostTensor& t, const std::vector<std::int64_t>& idx, std::size_t row_elems,
                std::size_t row_stride) {
  if (t.empty()) return {};
  HostTensor out(t.dtype(), idx.size() * row_elems);
  const std::size_t eb = t.bytes() / t.size();
  const auto* src = static_cast<const unsigned char*>(t.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  for (std::size_t j = 0; j < idx.size(); ++j)
    std::memcpy(dst + j * row_elems * eb, src + static_cast<std::size_t>(idx[j]) * row_stride * eb,
                row_elems * eb);
  return out;
}

ColumnCheck column_reference(const CaseInputs& in, std::vector<std::int64_t> cols,
                             unsigned threads) {
  const Problem& p = in.c.problem;
  ColumnCheck c;
  c.cols = std::move(cols);
  c.sub.c = in.c;
  Problem& q = c.sub.c.problem;
  q.N = static_cast<std::int64_t>(c.cols.size());
  q.ldw = 0;  // the picked rows of W are packed
  q.ldy = 0;
  c.sub.seed = in.seed;
  c.sub.x = in.x;
  const auto K = static_cast<std::size_t>(p.K);
  c.sub.w = pick(in.w, c.cols, K, static_cast<std::size_t>(p.lda_w()));
  c.sub.bias = pick(in.bias, c.cols, 1, 1);
  c.sub.scale = pick(in.scale, c.cols, 1, 1);
  c.sub.gamma = pick(in.gamma, c.cols, 1, 1);
  c.sub.beta = pick(in.beta, c.cols, 1, 1);
  c.sub.running_mean = pick(in.running_mean, c.cols, 1, 1);
  c.sub.running_var = pick(in.running_var, c.cols, 1, 1);
  c.sub.num_batches_tracked = in.num_batches_tracked;
  ReferenceSettings s = reference_settings(p, in.num_batches_tracked);
  s.threads = threads;
  c.ref = reference_forward(reference_inputs(c.sub), s);
  return c;
}

std::vector<double> pick(const std::vector<double>& v, const std::vector<std::int64_t>& cols) {
  if (v.empty()) return {};
  std::vector<double> out(cols.size());
  for (std::size_t j = 0; j < cols.size(); ++j) out[j] = v[static_cast<std::size_t>(cols[j])];
  return out;
}

CaseOutputs pick_columns(const CaseOutputs& got, const std::vector<std::int64_t>& cols,
                         std::int64_t M, std::int64_t N) {
  CaseOutputs out;
  out.y.resize(static_cast<std::size_t>(M) * cols.size());
  for (std::int64_t m = 0; m < M; ++m)
    for (std::size_t j = 0; j < cols.size(); ++j)
      out.y[static_cast<std::size_t>(m) * cols.size() + j] =
          got.y[static_cast<std::size_t>(m * N + cols[j])];
  out.running_mean = pick(got.running_mean, cols);
  out.running_var = pick(got.running_var, cols);
  out.save_mean = pick(got.save_mean, cols);
  out.save_invstd = pick(got.save_invstd, cols);
  out.num_batches_tracked = got.num_batches_tracked;
  out.y_padding_intact = got.y_padding_intact;
  return out;
}

}  // namespace

std::string_view name(CandidateOutcome::Status s) {
  switch (s) {
    case Status::timed:
      return "timed";
    case Status::dropped:
      return "dropped";
    case Status::failed:
      return "failed";
    case Status::rejected:
      return "rejected";
    case Status::verified:
      return "verified";
  }
  return "?";
}

std::vector<std::string> tuning_candidates(const Problem& p, const Device& d,
                                           bool include_reference) {
  std::vector<std::string> out;
  for (const auto& c : contenders(p, d, include_reference)) out.push_back(c.out.key);
  return out;
}

std::vector<KernelSource> tuning_sources(const Problem& p, const Device& d,
                                         bool include_reference) {
  std::vector<KernelSource> out;
  for (const auto& c : contenders(p, d, include_reference))
    out.push_back(contender_source(p, c.config));
  return out;
}

std::vector<std::int64_t> verification_columns(const Problem& p, std::int64_t budget) {
  const std::int64_t N = p.N;
  std::vector<std::int64_t> out;
  if (static_cast<double>(p.M) * static_cast<double>(N) * static_cast<double>(p.K) <=
      static_cast<double>(budget)) {
    out.resize(static_cast<std::size_t>(N));
    for (std::int64_t n = 0; n < N; ++n) out[static_cast<std::size_t>(n)] = n;
    return out;
  }
  const std::int64_t per_column = std::max<std::int64_t>(1, p.M * p.K);
  const std::int64_t want = std::min(N, std::max<std::int64_t>(64, budget / per_column));
  std::set<std::int64_t> s;
  // Edges and tile boundaries are where indexing bugs live.
  for (std::int64_t n = 0; n < std::min<std::int64_t>(8, N); ++n) s.insert(n);
  for (std::int64_t n = std::max<std::int64_t>(0, N - 8); n < N; ++n) s.insert(n);
  for (std::int64_t b = 64; b <= 512 && b < N; b += 64) s.insert({b - 1, b});
  // `want` distinct positions (N / want >= 1 apart), so the set holds at least `want`.
  for (std::int64_t i = 0; i < want; ++i) s.insert(i * N / want);
  return {s.begin(), s.end()};
}

TuneResult tune(const Problem& p, const TunerOptions& o) {
  p.validate();
  if (o.min_runs < 1 || o.max_runs < o.min_runs)
    throw InvalidArgument("runs", fmt::format("expected 1 <= min_runs <= max_runs; got {} and {}",
                                              o.min_runs, o.max_runs));
  const auto t0 = Clock::now();
  primary_context(o.device);
  const Device dev = Device::get(o.device);
  TuneResult result;
  std::vector<Contender> cs = contenders(p, dev, o.include_reference);

  // 1. Compile everything at once (NVRTC dominates a tune), then load sequentially.
  const auto tc = Clock::now();
  std::vector<std::string> keys;
  for (const Contender& c : cs) keys.push_back(c.out.key);
  const std::vector<std::string> compile_errors = compile_all(
      cs.size(), [&](std::size_t i) { return contender_source(p, cs[i].config); }, keys, dev.arch(),
      o);
  result.compile_seconds = seconds_since(tc);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    Contender& c = cs[i];
    if (!compile_errors[i].empty()) {
      c.out.message = "compile: " + compile_errors[i];
      continue;
    }
    try {
      if (c.config) {
        // candidate_configs only lists configs valid for p on this device.
        c.core = plan_core(p, *c.config, context_for(o.device), o.cache_dir);
        const WorkspaceLayout layout = workspace_layout(p, *c.config);
        c.shape = run_shape(*c.core, p.M, layout);
        c.workspace = DeviceBuffer(layout.total);
      } else {
        ReferenceOpOptions ro;
        ro.device = o.device;
        ro.cache_dir = o.cache_dir;
        c.reference = std::make_unique<ReferenceOp>(p, ro);
      }
    } catch (const std::exception& e) {
      c.out.message = "build: " + first_line(e.what());
    }
  }

  const std::lock_guard<std::mutex> measure_alone(measuring_lock());

  // 2. Inputs (non-centred x, as KernelBench draws it: the harder case for batch statistics),
  // and the float64 reference, computed on the other cores while the GPU times.
  SweepCase sc;
  sc.problem = p;
  sc.distribution = Distribution::non_centred;
  const CaseInputs in = make_case_inputs(sc, o.seed);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  // Declared after `in`: a std::async future waits in its destructor, so whatever happens
  // below, the thread is done with `in` before `in` goes away.
  std::future<ColumnCheck> check = std::async(std::launch::async, [&in, hw] {
    return column_reference(in, verification_columns(in.c.problem), std::max(1u, hw - 1));
  });
  const int nsets = input_sets(p, dev);
  std::vector<DeviceCase> data;
  data.reserve(static_cast<std::size_t>(nsets));
  for (int i = 0; i < nsets; ++i) data.emplace_back(in);
  std::vector<Tensors> sets;
  for (const auto& d : data) sets.push_back(d.tensors());
  // DeviceCase poisons its outputs with memsets on the legacy stream, which our non-blocking
  // stream does not wait for: finish them before anything runs.
  FJ_CU(cuCtxSynchronize());
  const Stream stream;

  // 3. Time.
  std::vector<TimedCandidate> timed;
  for (Contender& c : cs) {
    TimedCandidate t{&c.out, {}};
    if (c.built())
      t.run = [&sets, &c](CUstream s, int set) { c.run(s, sets[static_cast<std::size_t>(set)]); };
    timed.push_back(std::move(t));
  }
  time_candidates(timed, static_cast<int>(sets.size()), stream.get(), o);

  // 4. Verify in order of time until one passes; when the reference wins, go on to the best
  // fused config too (a Plan that runs the reference still reports one).
  std::vector<Contender*> order;
  for (auto& c : cs)
    if (c.out.median_ms && c.out.status != Status::failed) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const Contender* a, const Contender* b) {
    return *a->out.median_ms < *b->out.median_ms;
  });
  const ColumnCheck ref = check.get();
  const double threshold = sweep_threshold(p.dtype);
  const std::size_t y_bytes = static_cast<std::size_t>(p.M * p.lda_y()) * storage_bytes(p.dtype);
  Contender* winner = nullptr;
  Contender* best_fused = nullptr;
  std::size_t verified = 0;
  for (std::size_t k = 0; k < order.size() && !best_fused; ++k) {
    Contender& c = *order[k];
    if (winner && !c.config) continue;  // after a reference win, only fused ones are wanted
    report(o, TuneProgress::Stage::verifying, verified, order.size(), c.out.key);
    ++verified;
    const bool ok = verify_candidate(c.out, "autotune " + p.key(), [&](std::string* why) {
      DeviceCase& d = data.front();
      // Nothing of an earlier candidate may still run (one that threw after some launches) when
      // the poison goes down; DeviceBuffer's writes have landed when they return.
      FJ_CU(cuCtxSynchronize());
      d.reset(in);
      const Tensors t = d.tensors();
      c.run(stream, t);
      if (inject_wrong_here(o, c.out.key, k))
        FJ_CU(cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(t.y), 0x40, y_bytes, stream.get()));
      stream.synchronize();
      const CaseOutputs got = pick_columns(d.download(), ref.cols, p.M, p.N);
      CaseErrors e = compare(ref.sub, got, ref.ref);
      // The reference op's tf32 GEMM is cuBLASLt's, whose kernels may also truncate x and W or
      // read them whole: judged against its other readings too before it is called wrong, as
      // the sweep judges it (ref.ref is the first, rounded, reading's).
      if (!c.config && p.dtype == DType::tf32 && !passes(e, threshold)) {
        const ReadingErrors others =
            compare_readings(ref.sub, got, reference_settings(p, ref.sub.num_batches_tracked),
                             std::span(kCublasLtTf32Readings).subspan(1), threshold);
        if (others.errors.worst() < e.worst()) e = others.errors;
      }
      c.out.error = e.worst();
      return passes(e, threshold, why);
    });
    if (ok) {
      if (!winner) winner = &c;
      if (c.config) best_fused = &c;
    }
  }
  report(o, TuneProgress::Stage::verifying, verified, verified, winner ? winner->out.key : "");
  // Copies of what `winner` and `best_fused` point into.
  const std::optional<CandidateOutcome> won =
      winner ? std::optional<CandidateOutcome>(winner->out) : std::nullopt;
  const std::optional<CandidateOutcome> fused =
      best_fused ? std::optional<CandidateOutcome>(best_fused->out) : std::nullopt;

  for (const auto& c : cs) result.candidates.push_back(c.out);
  rank_by_time(result.candidates);
  if (!won) throw_none_verified("autotune " + p.key(), result.candidates);

  // 5. Record.
  TuningEntry& e = result.entry;
  e.problem = p;
  e.winner = won->key;
  e.winner_ms = *won->median_ms;
  e.error = won->error;
  e.candidates = static_cast<int>(cs.size());
  e.timestamp = static_cast<std::int64_t>(std::time(nullptr));
  for (const auto& c : result.candidates)
    if (c.key == kReferenceCandidate && c.median_ms) e.reference_ms = c.median_ms;
  if (const CandidateOutcome* r = runner_up(result.candidates, e.winner)) {
    e.runner_up = r->key;
    e.runner_up_ms = r->median_ms;
  }
  if (fused) {
    e.best_fused = fused->key;
    e.best_fused_ms = fused->median_ms;
  }
  const TuningDb db = TuningDb::for_device(dev, o.cache_dir);
  result.db_path = db.path().string();
  if (o.record) result.recorded = db.record(e);
  result.seconds = seconds_since(t0);
  log()->info("autotune {}: {} {:.4f} ms (reference {}), runner-up {}, {} candidates, {:.1f} s",
              p.key(), e.winner, e.winner_ms,
              e.reference_ms ? fmt::format("{:.4f} ms", *e.reference_ms) : std::string("-"),
              e.runner_up.empty() ? std::string("-") : e.runner_up, e.candidates, result.seconds);
  report(o, TuneProgress::Stage::done, 1, 1, e.winner);
  return result;
}

}  // namespace fusejit
