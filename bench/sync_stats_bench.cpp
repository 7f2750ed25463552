// fusejit_sync_stats_bench: what synchronizing the BatchNorm statistics across data-parallel
// ranks costs per step. One process per GPU (tests/multi/rank_launcher.hpp); on every rank the
// same per-rank batch (global M / world rows, bf16, train) runs through a plan with
// stat_ranks = world over NCCL and through the unsynchronized plan (stat_ranks = 0) with the same
// kernel config, alternating samples of back-to-back runs between CUDA events after warm-up.
// The parent prints, per shape and world size, the slowest rank's median per step of each and
// their ratio.
//   fusejit_sync_stats_bench [--shapes 1024x8192x8192,16384x4096x4096] [--worlds 2,4]
//                            [--runs 20] [--samples 9]
// --worlds defaults to 2, and 4 when 4 GPUs are present (1 may be asked for: the schedule's own
// cost on one GPU); a world larger than the GPU count is
// skipped with a note.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/device/event_timer.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/verify/host_tensor.hpp"
#include "multi/rank_launcher.hpp"

namespace {

using namespace fusejit;

struct Options {
  std::vector<Shape> shapes{{1024, 8192, 8192}, {16384, 4096, 4096}};
  std::vector<int> worlds;  // empty: 2, and 4 when there are 4 GPUs
  int runs = 20;            // runs per sample (between two events)
  int samples = 9;          // samples per plan, alternating between the two plans
  int warmup = 10;
};

// One rank's figures for one shape.
struct Figures {
  std::uint64_t shape = 0;
  double unsync_ms = 0, sync_ms = 0;
  std::string unsync_config, sync_config;
};

std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const std::size_t comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
  }
  return out;
}

// Milliseconds per run of `runs` back-to-back runs: the queue stays full, as in a training loop,
// so the host's launch time hides behind the kernels of the run before.
double ms_per_run(const Plan& plan, const Tensors& t, const Stream& s, int runs) {
  const Event start, stop;
  start.record(s);
  for (int i = 0; i < runs; ++i) plan.run(s, t);
  stop.record(s);
  stop.synchronize();
  return static_cast<double>(Event::elapsed_ms(start, stop)) / runs;
}

int bench_rank(multi::RankContext& ctx, const Options& opt) {
  primary_context(ctx.rank);  // NCCL takes its device from the current context
  const multi::Communicator comm(ctx);
  const Stream s;
  for (std::size_t si = 0; si < opt.shapes.size(); ++si) {
    const Shape& g = opt.shapes[si];
    Problem p;
    p.M = g.M / ctx.world, p.N = g.N, p.K = g.K;
    p.dtype = DType::bf16;
    p.mode = Mode::train;
    const auto M = static_cast<std::size_t>(p.M), N = static_cast<std::size_t>(p.N),
               K = static_cast<std::size_t>(p.K);
    // Random data, as in training: the tensor cores' power (and so their clock) depends on it.
    HostTensor x(DType::bf16, M * K), w(DType::bf16, N * K), par(DType::fp32, N);
    fill_normal(x, 0.0, 1.0, 17 + static_cast<std::uint64_t>(ctx.rank));
    fill_uniform(w, -1.0 / std::sqrt(double(K)), 1.0 / std::sqrt(double(K)), 23);
    fill_uniform(par, 0.5, 1.5, 29);
    DeviceBuffer xd(x.bytes()), wd(w.bytes()), yd(M * N * 2), pd(par.bytes()), rm(N * 4), rv(N * 4);
    xd.upload(x.data(), x.bytes());
    wd.upload(w.data(), w.bytes());
    pd.upload(par.data(), par.bytes());
    rm.fill_bytes(0);
    rv.upload(par.data(), par.bytes());
    Tensors t;
    t.x = xd.get(), t.w = wd.get(), t.y = yd.get();
    t.bias = t.scale = t.gamma = t.beta = pd.get();
    t.running_mean = rm.get(), t.running_var = rv.get();

    PlanOptions o;
    o.device = ctx.rank;
    const Plan unsync(p, o);
    // The same config for both, so the difference is the synchronization alone (the tuning
    // database keys the synchronized problem apart and may hold nothing for it).
    Problem ps = p;
    ps.stat_ranks = ctx.world;
    PlanOptions so = o;
    so.stats_comm = comm.get();
    so.config = unsync.config();
    std::unique_ptr<Plan> sync;
    try {
      sync = std::make_unique<Plan>(ps, so);
    } catch (const InvalidArgument& e) {
      std::fprintf(stderr, "rank %d: %s; the synchronized plan picks its own config\n", ctx.rank,
                   e.what());
      so.config.reset();
      sync = std::make_unique<Plan>(ps, so);
    }
    for (int i = 0; i < opt.warmup; ++i) {
      unsync.run(s, t);
      sync->run(s, t);
    }
    s.synchronize();
    std::vector<double> u, v;
    for (int i = 0; i < opt.samples; ++i) {
      u.push_back(ms_per_run(unsync, t, s, opt.runs));
      v.push_back(ms_per_run(*sync, t, s, opt.runs));
    }
    multi::Writer msg;
    msg.put(static_cast<std::uint64_t>(si)).put(median(u)).put(median(v));
    msg.put_string(unsync.uses_reference() ? "cuBLASLt reference" : unsync.config().key());
    msg.put_string(sync->config().key());
    ctx.send(msg);
  }
  return 0;
}

int usage(const char* argv0, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [--shapes MxNxK,...] [--worlds 2,4] [--runs N] [--samples N]\n", argv0);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool has_value = i + 1 < argc;
      if (a == "--shapes" && has_value) {
        opt.shapes.clear();
        for (const auto& s : split_list(argv[++i])) opt.shapes.push_back(parse_shape(s));
      } else if (a == "--worlds" && has_value) {
        for (const auto& s : split_list(argv[++i])) opt.worlds.push_back(std::stoi(s));
      } else if (a == "--runs" && has_value) {
        opt.runs = std::max(1, std::stoi(argv[++i]));
      } else if (a == "--samples" && has_value) {
        opt.samples = std::max(1, std::stoi(argv[++i]));
      } else if (a == "--help" || a == "-h") {
        return usage(argv[0], 0);
      } else {
        return usage(argv[0], 2);
      }
    }
    const multi::GpuProbe gpus = multi::probe_gpus();
    const bool one_asked = opt.worlds.size() == 1 && opt.worlds[0] == 1;
    if (gpus.count < (one_asked ? 1 : 2)) {
      std::printf("fusejit_sync_stats_bench: needs at least 2 GPUs (1 for --worlds 1); %s\n",
                  gpus.count == 0 ? gpus.why.c_str() : "this machine has 1");
      return 0;
    }
    if (opt.worlds.empty()) {
      opt.worlds.push_back(2);
      if (gpus.count >= 4) opt.worlds.push_back(4);
    }
    std::printf(
        "%d GPUs; bf16 train, per-rank M = global M / world; per figure: the slowest "
        "rank's median of %d samples, each the mean of %d back-to-back runs between CUDA "
        "events, after %d warm-up runs; unsync and sync samples alternate\n",
        gpus.count, opt.samples, opt.runs, opt.warmup);
    struct Row {
      std::string shape;
      int world = 0;
      std::int64_t rank_m = 0;
      Figures f;
    };
    std::vector<Row> table;
    bool ok = true;
    for (const int world : opt.worlds) {
      // World 1 (asked for by --worlds 1) times the synchronized schedule's own cost on one
      // GPU: its extra kernels and a one-rank all-gather.
      if (world < 1 || world > gpus.count) {
        std::printf("world %d skipped: %d GPUs here\n", world, gpus.count);
        continue;
      }
      const multi::LaunchResult res = multi::launch_ranks(
          world, [&opt](multi::RankContext& ctx) { return bench_rank(ctx, opt); },
          [&](std::vector<multi::Bytes>& m) {
            Row row;
            row.world = world;
            for (std::size_t r = 0; r < m.size(); ++r) {
              multi::Reader rd(m[r]);
              Figures f;
              f.shape = rd.get<std::uint64_t>();
              f.unsync_ms = rd.get<double>();
              f.sync_ms = rd.get<double>();
              f.unsync_config = rd.get_string();
              f.sync_config = rd.get_string();
              if (r == 0) {
                row.f = f;
              } else {  // a step takes as long as its slowest rank
                row.f.unsync_ms = std::max(row.f.unsync_ms, f.unsync_ms);
                row.f.sync_ms = std::max(row.f.sync_ms, f.sync_ms);
              }
            }
            const Shape& g = opt.shapes.at(row.f.shape);
            row.shape = format_shape(g);
            row.rank_m = g.M / world;
            table.push_back(row);
            std::printf("  %s world %d: unsync %.4f ms, sync %.4f ms (%s)\n", row.shape.c_str(),
                        world, row.f.unsync_ms, row.f.sync_ms, row.f.sync_config.c_str());
          },
          900.0);
      if (!res.ok()) {
        ok = false;
        std::string codes;
        for (const int c : res.exit_codes) codes += " " + std::to_string(c);
        std::printf("world %d FAILED: exit codes%s%s%s\n", world, codes.c_str(),
                    res.timed_out ? "; timed out" : "",
                    res.problems.empty() ? "" : ("; " + res.problems).c_str());
      }
    }
    std::printf("\n%-18s %5s %7s %10s %10s %7s  %s\n", "shape", "world", "rank M", "unsync ms",
                "sync ms", "ratio", "config (unsync / sync)");
    for (const Row& r : table)
      std::printf(
          "%-18s %5d %7lld %10.4f %10.4f %7.3f  %s%s\n", r.shape.c_str(), r.world,
          static_cast<long long>(r.rank_m), r.f.unsync_ms, r.f.sync_ms, r.f.sync_ms / r.f.unsync_ms,
          r.f.unsync_config.c_str(),
          r.f.sync_config == r.f.unsync_config ? " (same)" : (" / " + r.f.sync_config).c_str());
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusejit_sync_stats_bench: %s\n", e.what());
    return 1;
  }
}
