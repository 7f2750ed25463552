#include "fusejit/tune/backward_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <future>
#include <memory>
#include <mutex>
#include <set>

#include "fusejit/config/candidates.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/plan/plan_core.hpp"
#include "fusejit/tune/measure.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/log.hpp"
#include "fusejit/verify/cpu_backward_reference.hpp"
#include "fusejit/verify/verification.hpp"

namespace fusejit {

namespace {

using Clock = std::chrono::steady_clock;
using Status = CandidateOutcome::Status;

// A backward run's tensor maps are cached per core and per input set: with one cache per core,
// rotating sets would re-encode them on every run.
struct Contender {
  BackwardConfig config;
  std::shared_ptr<const BackwardCore> core;
  BackwardLt lt;                                          // its GEMMs on cuBLASLt, if any
  std::vector<std::unique_ptr<BackwardRunCache>> caches;  // one per input set
  CandidateOutcome out;
};

// One input set: the forward's inputs and what a forward run saved, dy, every gradient, a
// workspace.
struct InputSet {
  InputSet(const CaseInputs& in, const HostTensor& dy_host, std::size_t workspace_bytes)
      : fwd(in, true), workspace(workspace_bytes) {
    const Problem& p = in.c.problem;
    const DType st = storage_type(p.dtype), pd = storage_type(p.param_dtype);
    dy = DeviceBuffer(dy_host.bytes());
    dy.upload(dy_host.data(), dy_host.bytes());
    dx = DeviceBuffer(static_cast<std::size_t>(p.M * p.lda_x()) * storage_bytes(st));
    dw = DeviceBuffer(static_cast<std::size_t>(p.N * p.lda_w()) * storage_bytes(st));
    for (DeviceBuffer* b : {&dbias, &dscale, &dgamma, &dbeta})
      *b = DeviceBuffer(static_cast<std::size_t>(p.N) * storage_bytes(pd));
    t = backward_inputs(p.mode, fwd.tensors(), dy.get());
    t.dx = dx.get();
    t.dw = dw.get();
    if (p.has_bias) t.dbias = dbias.get();
    if (p.has_scale) t.dscale = dscale.get();
    if (p.has_affine) {
      t.dgamma = dgamma.get();
      t.dbeta = dbeta.get();
    }
  }
  // NaN in every gradient, so a run that skips one is caught.
  void poison(const Problem& p) {
    const DType st = storage_type(p.dtype), pd = storage_type(p.param_dtype);
    dx.fill_words(nan_word(st));
    dw.fill_words(nan_word(st));
    for (DeviceBuffer* b : {&dbias, &dscale, &dgamma, &dbeta}) b->fill_words(nan_word(pd));
  }
  DeviceCase fwd;
  DeviceBuffer dy, dx, dw, dbias, dscale, dgamma, dbeta, workspace;
  BackwardTensors t;
};

// The gradients of set `s` as the reference holds them: dx at `dx_cols`, dW at `dw_rows`.
BackwardGradients read_gradients(const InputSet& s, const Problem& p,
                                 const std::vector<std::int64_t>& dx_cols,
                                 const std::vector<std::int64_t>& dw_rows) {
  const DType st = storage_type(p.dtype), pd = storage_type(p.param_dtype);
  BackwardGradients g;
  const std::vector<double> dx = download_packed(s.dx, st, p.M, p.K, p.lda_x());
  g.dx.reserve(static_cast<std::size_t>(p.M) * dx_cols.size());
  for (std::int64_t m = 0; m < p.M; ++m)
    for (const std::int64_t k : dx_cols) g.dx.push_back(dx[static_cast<std::size_t>(m * p.K + k)]);
  const std::vector<double> dw = download_packed(s.dw, st, p.N, p.K, p.lda_w());
  for (const std::int64_t n : dw_rows)
    g.dw.insert(g.dw.end(), dw.begin() + n * p.K, dw.begin() + (n + 1) * p.K);
  auto param = [&](const DeviceBuffer& b, bool present) {
    return present ? download_packed(b, pd, 1, p.N, p.N) : std::vector<double>{};
  };
  g.dbias = param(s.dbias, p.has_bias);
  g.dscale = param(s.dscale, p.has_scale);
  g.dgamma = param(s.dgamma, p.has_affine);
  g.dbeta = param(s.dbeta, p.has_affine);
  return g;
}

}  // namespace

std::vector<BackwardConfig> backward_tuning_configs(const Problem& p, const Device& d) {
  validate_backward_problem(p);
  // What an untuned plan of p runs (its class's choice, dX moved at p's own M) first.
  const BackwardConfig heuristic = plan_backward_config(p, default_backward_config(p, d), d);
  std::vector<BackwardConfig> out{heuristic};
  auto add = [&](const BackwardConfig& c) {
    if (c.key() != heuristic.key()) out.push_back(c);
  };
  const BackwardGemms g = backward_gemms(p);
  // Each GEMM's tiles beside the heuristic's other GEMM, then each on cuBLASLt.
  for (const KernelConfig& k : grad_gemm_candidates(p, g.dx, false, d)) {
    BackwardConfig c = heuristic;
    c.dx = k, c.dx_cublaslt = false;
    add(c);
  }
  for (const KernelConfig& k : grad_gemm_candidates(p, g.dw, true, d)) {
    BackwardConfig c = heuristic;
    c.dw = k, c.dw_cublaslt = false;
    add(c);
  }
  BackwardConfig lt_dx = heuristic, lt_dw = heuristic;
  lt_dx.dx = {}, lt_dx.dx_cublaslt = true;
  lt_dw.dw = {}, lt_dw.dw_cublaslt = true;
  add(lt_dx);
  add(lt_dw);
  return out;
}

std::vector<KernelSource> backward_tuning_sources(const Problem& p, const Device& d) {
  std::vector<KernelSource> out;
  for (const BackwardConfig& c : backward_tuning_configs(p, d))
    out.push_back(generate_backward(p, c));
  return out;
}

TuneResult tune_backward(const Problem& p, const TunerOptions& o) {
  validate_backward_problem(p);
  if (o.min_runs < 1 || o.max_runs < o.min_runs)
    throw InvalidArgument("runs", fmt::format("expected 1 <= min_runs <= max_runs; got {} and {}",
                                              o.min_runs, o.max_runs));
  const auto t0 = Clock::now();
  primary_context(o.device);
  const CUcontext ctx = context_for(o.device);
  const Device dev = Device::get(o.device);
  TuneResult result;
  std::vector<Contender> cs;
  for (const BackwardConfig& c : backward_tuning_configs(p, dev)) {
    Contender k;
    k.config = c;
    k.out.key = c.key();
    cs.push_back(std::move(k));
  }

  // 1. Compile every kernel set at once, then load sequentially.
  auto build = [&](std::vector<Contender*> todo) {
    std::vector<std::string> keys;
    for (const Contender* c : todo) keys.push_back(c->out.key);
    const auto tc = Clock::now();
    const std::vector<std::string> errors = compile_all(
        todo.size(), [&](std::size_t i) { return generate_backward(p, todo[i]->config); }, keys,
        dev.arch(), o);
    result.compile_seconds += seconds_since(tc);
    for (std::size_t i = 0; i < todo.size(); ++i) {
      Contender& c = *todo[i];
      if (!errors[i].empty()) {
        c.out.message = "compile: " + errors[i];
        continue;
      }
      try {
        // Both or neither: a contender without its cuBLASLt GEMMs would fail at run time
        // with a message that hides why.
        auto core = backward_core(p, c.config, ctx, o.cache_dir);
        c.lt = make_backward_lt(p, c.config);
        c.core = std::move(core);
      } catch (const std::exception& e) {
        c.out.message = "build: " + first_line(e.what());
      }
    }
  };
  {
    std::vector<Contender*> all;
    for (Contender& c : cs) all.push_back(&c);
    build(all);
  }

  const std::lock_guard<std::mutex> measure_alone(measuring_lock());

  // 2. Inputs (non-centred x, as tune() draws them), each set's `saved` from a forward run of
  // the heuristic's kernels, and dy.
  SweepCase sc;
  sc.problem = p;
  sc.distribution = Distribution::non_centred;
  const CaseInputs in = make_case_inputs(sc, o.seed);
  const DType st = storage_type(p.dtype);
  HostTensor dy(st, static_cast<std::size_t>(p.M * p.lda_y()));
  fill_normal(dy, 0.0, 1.0, in.seed + 1);
  std::size_t ws_bytes = 0;  // one workspace per input set, for every contender's layout
  for (const Contender& c : cs)
    ws_bytes = std::max(ws_bytes, backward_workspace(p, c.config, p.M, c.lt.workspace).total);
  const double set_bytes =
      static_cast<double>(storage_bytes(st)) *
      static_cast<double>(2 * p.M * p.lda_x() + 2 * p.N * p.lda_w() + 3 * p.M * p.lda_y());
  const int nsets = timing_input_sets(set_bytes + static_cast<double>(ws_bytes), dev, 1, 4);
  std::vector<std::unique_ptr<InputSet>> sets;
  const KernelConfig fwd_config = default_config(p, dev);
  const auto fwd = plan_core(p, fwd_config, ctx, o.cache_dir);
  const WorkspaceLayout fwd_layout = workspace_layout(p, fwd_config);
  const DeviceBuffer fwd_workspace(fwd_layout.total);
  const Stream stream;
  FJ_CU(cuCtxSynchronize());  // DeviceCase's poison memsets run on the legacy stream
  for (int i = 0; i < nsets; ++i) {
    sets.push_back(std::make_unique<InputSet>(in, dy, ws_bytes));
    FJ_CU(cuCtxSynchronize());
    launch(*fwd, run_shape(*fwd, p.M, fwd_layout), stream, sets.back()->fwd.tensors(),
           fwd_workspace.get());
  }
  stream.synchronize();
  for (Contender& c : cs)
    for (int i = 0; i < nsets; ++i) c.caches.push_back(std::make_unique<BackwardRunCache>());

  // The float64 backward of set 0's dy and saved, on the other cores while the GPU times.
  const CaseOutputs saved0 = sets.front()->fwd.download();
  const std::vector<std::int64_t> dx_cols = verification_columns(dx_gemm_problem(p));
  const std::vector<std::int64_t> dw_rows = verification_columns(p);
  std::future<BackwardReferenceOutputs> check =
      std::async(std::launch::async, [&in, &dy, &saved0, &dx_cols, &dw_rows, &p] {
        SavedForward f;
        f.saved = saved0.saved;
        if (p.mode == Mode::train) f.save_invstd = saved0.save_invstd;
        return backward_reference_from_saved(
            p, reference_inputs(in),
            dy.packed(static_cast<std::size_t>(p.M), static_cast<std::size_t>(p.N),
                      static_cast<std::size_t>(p.lda_y())),
            f, dx_cols, dw_rows);
      });

  // 3. Time; then the pair of the fastest dx and the fastest dw, beside the fastest so far.
  auto timed = [&](std::vector<Contender*> todo) {
    std::vector<TimedCandidate> t;
    for (Contender* c : todo) {
      TimedCandidate k{&c->out, {}};
      if (c->core)
        k.run = [&sets, c, &p](CUstream s, int set) {
          const InputSet& in_set = *sets[static_cast<std::size_t>(set)];
          launch_backward(*c->core, p.M, false, s, in_set.t, in_set.workspace.get(),
                          c->caches[static_cast<std::size_t>(set)].get(), &c->lt);
        };
      t.push_back(std::move(k));
    }
    time_candidates(t, nsets, stream.get(), o);
  };
  {
    std::vector<Contender*> all;
    for (Contender& c : cs) all.push_back(&c);
    timed(all);
  }
  auto fastest = [&](auto&& pick) -> Contender* {
    Contender* best = nullptr;
    for (Contender& c : cs)
      if (c.out.status == Status::timed && pick(c) &&
          (!best || *c.out.median_ms < *best->out.median_ms))
        best = &c;
    return best;
  };
  const BackwardConfig heuristic = cs.front().config;
  Contender* best_dx =
      fastest([&](const Contender& c) { return c.config.dw_key() == heuristic.dw_key(); });
  Contender* best_dw =
      fastest([&](const Contender& c) { return c.config.dx_key() == heuristic.dx_key(); });
  if (best_dx && best_dw) {
    BackwardConfig pair = best_dx->config;
    pair.dw = best_dw->config.dw, pair.dw_cublaslt = best_dw->config.dw_cublaslt;
    const bool listed = std::any_of(cs.begin(), cs.end(),
                                    [&](const Contender& c) { return c.out.key == pair.key(); });
    if (!listed) {
      // The new pair is timed side by side with every close contender (within final_ratio of
      // the fastest), as the first timing's final rounds were: medians from two timing
      // sessions differ by the clock's drift, not only by speed. By key: the push below may
      // move the contenders.
      const double best_ms = *fastest([](const Contender&) { return true; })->out.median_ms;
      std::vector<std::string> close;
      for (const Contender& c : cs)
        if (c.out.status == Status::timed && *c.out.median_ms <= o.final_ratio * best_ms)
          close.push_back(c.out.key);
      Contender k;
      k.config = pair;
      k.out.key = pair.key();
      for (int i = 0; i < nsets; ++i) k.caches.push_back(std::make_unique<BackwardRunCache>());
      cs.push_back(std::move(k));
      Contender& added = cs.back();
      build({&added});
      // The input sets' workspaces were sized for the first contenders.
      if (added.core && backward_workspace(p, pair, p.M, added.lt.workspace).total > ws_bytes) {
        added.core.reset();
        added.out.message = "not run: its workspace exceeds the input sets'";
      }
      std::vector<Contender*> again{&added};
      for (Contender& c : cs)
        if (std::find(close.begin(), close.end(), c.out.key) != close.end()) again.push_back(&c);
      timed(again);
    }
  }

  // 4. Verify in order of time until one passes.
  std::vector<Contender*> order;
  for (auto& c : cs)
    if (c.out.median_ms && c.out.status != Status::failed) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const Contender* a, const Contender* b) {
    return *a->out.median_ms < *b->out.median_ms;
  });
  const BackwardReferenceOutputs ref = check.get();
  const double threshold = sweep_threshold(p.dtype);
  InputSet& v = *sets.front();
  Contender* winner = nullptr;
  std::size_t verified = 0;
  for (std::size_t k = 0; k < order.size() && !winner; ++k) {
    Contender& c = *order[k];
    report(o, TuneProgress::Stage::verifying, verified++, order.size(), c.out.key);
    const bool ok =
        verify_candidate(c.out, "autotune --backward " + p.key(), [&](std::string* why) {
          // Nothing of an earlier candidate may still run (one that threw after some launches)
          // when the poison goes down; DeviceBuffer's writes have landed when they return.
          FJ_CU(cuCtxSynchronize());
          v.poison(p);
          launch_backward(*c.core, p.M, false, stream, v.t, v.workspace.get(), c.caches[0].get(),
                          &c.lt);
          if (inject_wrong_here(o, c.out.key, k))
            FJ_CU(cuMemsetD8Async(v.dx.address(), 0x40, v.dx.size(), stream.get()));
          stream.synchronize();
          const BackwardErrors e = compare_gradients(ref, read_gradients(v, p, dx_cols, dw_rows));
          c.out.error = e.worst();
          return passes(e, threshold, why);
        });
    if (ok) winner = &c;
  }
  report(o, TuneProgress::Stage::verifying, verified, verified, winner ? winner->out.key : "");
  const std::optional<CandidateOutcome> won =
      winner ? std::optional<CandidateOutcome>(winner->out) : std::nullopt;

  for (const auto& c : cs) result.candidates.push_back(c.out);
  rank_by_time(result.candidates);
  if (!won) throw_none_verified("autotune --backward " + p.key(), result.candidates);

  // 5. Record.
  TuningEntry& e = result.entry;
  e.problem = backward_entry_problem(p);
  e.winner = won->key;
  e.winner_ms = *won->median_ms;
  e.best_fused = won->key;
  e.best_fused_ms = won->median_ms;
  e.error = won->error;
  e.candidates = static_cast<int>(cs.size());
  e.timestamp = static_cast<std::int64_t>(std::time(nullptr));
  if (const CandidateOutcome* r = runner_up(result.candidates, e.winner)) {
    e.runner_up = r->key;
    e.runner_up_ms = r->median_ms;
  }
  const TuningDb db = TuningDb::for_device(dev, o.cache_dir);
  result.db_path = db.path().string();
  if (o.record) result.recorded = db.record(e, TunedPass::backward);
  result.seconds = seconds_since(t0);
  log()->info("autotune --backward {}: {} {:.4f} ms, runner-up {}, {} candidates, {:.1f} s",
              p.key(), e.winner, e.winner_ms, e.runner_up.empty() ? std::string("-") : e.runner_up,
              e.candidates, result.seconds);
  report(o, TuneProgress::Stage::done, 1, 1, e.winner);
  return result;
}

}  // namespace fusejit
