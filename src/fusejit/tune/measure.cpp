#include "fusejit/tune/measure.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "fusejit/compile/compiler.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/log.hpp"

namespace fusejit {

using Status = CandidateOutcome::Status;

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool inject_wrong_here(const TunerOptions& o, const std::string& key, std::size_t k) {
  return !o.inject_wrong_candidate.empty() &&
         (o.inject_wrong_candidate == key || (o.inject_wrong_candidate == "fastest" && k == 0));
}

bool verify_candidate(CandidateOutcome& c, const std::string& who,
                      const std::function<bool(std::string* why)>& check) {
  try {
    std::string why;
    if (check(&why)) {
      c.status = CandidateOutcome::Status::verified;
      return true;
    }
    c.status = CandidateOutcome::Status::rejected;
    c.message = "verification: " + why;
    log()->warn("{}: {} is fast ({:.4f} ms) but wrong ({}); trying the next best", who, c.key,
                *c.median_ms, why);
  } catch (const std::exception& e) {
    c.status = CandidateOutcome::Status::rejected;
    c.message = "verification run: " + first_line(e.what());
    log()->warn("{}: {} failed its verification run ({})", who, c.key, c.message);
  }
  return false;
}

void rank_by_time(std::vector<CandidateOutcome>& outcomes) {
  std::stable_sort(outcomes.begin(), outcomes.end(),
                   [](const CandidateOutcome& a, const CandidateOutcome& b) {
                     const bool ra = a.median_ms.has_value(), rb = b.median_ms.has_value();
                     if (ra != rb) return ra;
                     return ra && *a.median_ms < *b.median_ms;
                   });
}

const CandidateOutcome* runner_up(const std::vector<CandidateOutcome>& ranked,
                                  const std::string& winner) {
  for (const auto& c : ranked)
    if (c.key != winner && c.median_ms && c.status != Status::rejected &&
        c.status != Status::failed)
      return &c;
  return nullptr;
}

void throw_none_verified(const std::string& what, const std::vector<CandidateOutcome>& ranked) {
  std::string why;
  for (const auto& c : ranked)
    why += fmt::format("\n  {}: {} {}", c.key, name(c.status), c.message);
  throw Error(fmt::format("{}: no candidate passed verification{}", what, why));
}

std::mutex& measuring_lock() {
  static std::mutex m;
  return m;
}

void report(const TunerOptions& o, TuneProgress::Stage stage, std::size_t done, std::size_t total,
            const std::string& candidate) {
  if (!o.on_progress) return;
  TuneProgress pr;
  pr.stage = stage;
  pr.done = done;
  pr.total = total;
  pr.candidate = candidate;
  o.on_progress(pr);
}

std::vector<std::string> compile_all(std::size_t n,
                                     const std::function<KernelSource(std::size_t)>& source,
                                     const std::vector<std::string>& keys, const std::string& arch,
                                     const TunerOptions& o) {
  std::vector<std::string> errors(n);
  if (n == 0) return errors;
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::size_t> finished;
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      std::string err;
      try {
        compile_cached(source(i), arch, o.cache_dir);
      } catch (const std::exception& e) {
        err = first_line(e.what());
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        errors[i] = std::move(err);
        finished.push_back(i);
      }
      cv.notify_one();
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads = std::min<std::size_t>(n, o.compile_threads ? o.compile_threads : hw);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  try {
    for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  } catch (...) {
    if (pool.empty()) throw;  // with one worker or more every job still runs
  }
  std::exception_ptr failure;  // from the progress callback: rethrown after the join
  for (std::size_t reported = 0; reported < n; ++reported) {
    std::size_t i = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return finished.size() > reported; });
      i = finished[reported];
    }
    if (!failure) {
      try {
        report(o, TuneProgress::Stage::compiling, reported + 1, n, keys[i]);
      } catch (...) {
        failure = std::current_exception();
      }
    }
  }
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return errors;
}

void time_candidates(std::vector<TimedCandidate>& cs, int sets, CUstream stream,
                     const TunerOptions& o) {
  EventTimer timer(stream, o.max_runs);
  auto timed = [&](const TimedCandidate& c, int warmup, int count, std::vector<double>& times) {
    timer.time([&](int set, CUstream s) { c.run(s, set); }, sets, warmup, count, times);
  };
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    CandidateOutcome& out = *cs[i].out;
    if (cs[i].run) {
      try {
        std::vector<double> times;
        timed(cs[i], o.warmup, o.min_runs, times);
        double med = median(times);
        if (med > o.drop_ratio * best) {
          out.status = Status::dropped;
          out.message = fmt::format("{:.2f}x the best after {} runs", med / best, o.min_runs);
        } else {
          const int total =
              static_cast<int>(std::clamp(std::ceil(o.target_ms / std::max(med, 1e-6)),
                                          double(o.min_runs), double(o.max_runs)));
          if (total > o.min_runs) timed(cs[i], 0, total - o.min_runs, times);
          med = median(times);
          out.status = Status::timed;
          best = std::min(best, med);
        }
        out.median_ms = med;
        out.runs = static_cast<int>(times.size());
      } catch (const std::exception& e) {
        out.status = Status::failed;
        out.message = "run: " + first_line(e.what());
      }
    }
    report(o, TuneProgress::Stage::timing, i + 1, cs.size(), out.key);
  }

  // The close ones again, side by side: final_rounds rounds, each timing every close candidate
  // once (runs worth ~1 ms, at least one) in an order that rotates, so a clock drift reaches
  // all of them alike; each ranks by the median of its round medians.
  std::vector<TimedCandidate*> close;
  for (auto& c : cs)
    if (c.out->status == Status::timed && *c.out->median_ms <= o.final_ratio * best)
      close.push_back(&c);
  if (close.size() <= 1 || o.final_rounds <= 0) return;
  const int per_round = std::clamp(static_cast<int>(std::ceil(1.0 / std::max(best, 1e-6))), 1,
                                   std::min(10, o.max_runs));
  std::vector<std::vector<double>> rounds(close.size());
  for (int r = 0; r < o.final_rounds; ++r)
    for (std::size_t j = 0; j < close.size(); ++j) {
      const std::size_t k = (j + static_cast<std::size_t>(r)) % close.size();
      CandidateOutcome& out = *close[k]->out;
      if (out.status != Status::timed) continue;  // it failed in an earlier round
      std::vector<double> times;
      try {
        timed(*close[k], 0, per_round, times);
      } catch (const std::exception& e) {
        out.status = Status::failed;
        out.message = "run: " + first_line(e.what());
      }
      if (!times.empty()) rounds[k].push_back(median(times));
    }
  for (std::size_t k = 0; k < close.size(); ++k) {
    CandidateOutcome& out = *close[k]->out;
    if (out.status != Status::timed || rounds[k].empty()) continue;
    out.median_ms = median(rounds[k]);
    out.runs += o.final_rounds * per_round;
  }
}

}  // namespace fusejit
