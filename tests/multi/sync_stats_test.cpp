// Synchronized BatchNorm statistics (Problem::stat_ranks) across real ranks: one process per
// GPU (rank_launcher.hpp), every rank running its share of one global batch through a plan
// with stat_ranks = R over an NCCL communicator of R ranks. The parent, which never touches
// CUDA, gathers every rank's rows of y and its statistics and checks them against the float64
// reference of the whole global batch (the pass rule of every GPU test), and checks that the
// running and saved statistics and the counter are the same bits on every rank.
//
// Cases: R = 2 (and 4 where 4 GPUs are present) x splits {equal, ragged, an empty rank, a
// one-row rank} x dtypes {bf16, fp16, fp32, tf32} x the tiled and (on sm_90) warpspec variants,
// each at a global batch whose ranks hold at most one row tile and at one whose ranks hold many
// (> 8), plus momentum=None, split-K, pingpong and cluster configs, uniform x, half-precision
// parameters, and one run captured in a CUDA graph and launched twice.
//
// FUSEJIT_SYNC_DUMP_DIR=DIR: the bf16 ragged case named "dump" also writes its per-rank inputs
// and outputs there (raw little-endian arrays and manifest.json) for
// bench/sync_bn_torch.py --compare DIR, which runs nn.SyncBatchNorm on the same data.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/verify/verification.hpp"
#include "multi/rank_launcher.hpp"
#include "test_graph.hpp"

using namespace fusejit;
using multi::Bytes;

namespace {

enum class Split { equal, ragged, empty, single };

const char* name(Split s) {
  switch (s) {
    case Split::equal:
      return "equal";
    case Split::ragged:
      return "ragged";
    case Split::empty:
      return "empty-rank";
    case Split::single:
      return "one-row-rank";
  }
  return "?";
}

struct SyncCase {
  std::string line;  // the global batch as a sweep line: its M is the global row count
  Split split = Split::equal;
  std::optional<Variant> variant;
  std::string config;       // a forced config key, or empty
  std::int64_t plan_m = 0;  // Problem::M of every rank's plan, at least any rank's rows
  std::uint64_t seed = 0;
  bool graph = false;  // capture one run in a CUDA graph and launch it twice (two steps)
  bool dump = false;   // FUSEJIT_SYNC_DUMP_DIR gets this case's data

  std::string schedule() const {
    if (!config.empty()) return config;
    return variant ? std::string(fusejit::name(*variant)) : std::string("heuristic");
  }
  std::string text() const {
    return fmt::format("'{}' {} {}{}", line, name(split), schedule(), graph ? " graph x2" : "");
  }
};

// Rank r's row count. Ragged: rank r holds a share r + 1 (the last rank takes the remainder).
// The empty rank is rank 0 and the one-row rank the last, so both ends of the rank order hold
// the odd share.
std::vector<std::int64_t> split_rows(std::int64_t M, int R, Split s) {
  const auto W = static_cast<std::size_t>(R);
  std::vector<std::int64_t> rows(W, 0);
  auto spread = [&](std::int64_t total, std::size_t first, std::size_t last) {
    const auto n = static_cast<std::int64_t>(last - first);
    for (std::size_t r = first; r < last; ++r)
      rows[r] = total / n + (static_cast<std::int64_t>(r - first) < total % n ? 1 : 0);
  };
  switch (s) {
    case Split::equal:
      spread(M, 0, W);
      break;
    case Split::ragged: {
      const std::int64_t shares = std::int64_t{R} * (R + 1) / 2;
      std::int64_t used = 0;
      for (std::size_t r = 0; r + 1 < W; ++r) {
        rows[r] = M * static_cast<std::int64_t>(r + 1) / shares;
        used += rows[r];
      }
      rows[W - 1] = M - used;
      break;
    }
    case Split::empty:
      rows[0] = 0;
      spread(M, 1, W);
      break;
    case Split::single:
      rows[W - 1] = 1;
      spread(M - 1, 0, W - 1);
      break;
  }
  return rows;
}

std::vector<SyncCase> make_cases(int R, int cc) {
  const std::int64_t N = 264, K = 392;  // neither a multiple of the column tiles
  // Small: every rank's rows fit one row tile (<= 64). Large: an equal share is more than 8
  // row tiles of 128, and the ragged ranks' shares fall on both sides of 8 tiles.
  const std::int64_t small = 24 * R + 7, large = 1100 * R;
  // One plan M for the whole list: every case then runs a kernel set of its dtype, schedule
  // and momentum (M is a run-time value), so the list compiles a dozen sets, not a hundred.
  const std::int64_t plan_m = large;
  std::vector<SyncCase> cases;
  std::uint64_t seed = 0x5eed0000u + static_cast<std::uint64_t>(R) * 1000;
  auto add = [&](std::int64_t M, const std::string& rest, Split split,
                 std::optional<Variant> variant, const std::string& config) {
    SyncCase c;
    c.line = fmt::format("{}x{}x{} {}", M, N, K, rest);
    c.split = split;
    c.variant = variant;
    c.config = config;
    c.plan_m = plan_m;
    c.seed = ++seed;
    cases.push_back(c);
    return cases.size() - 1;
  };
  // An empty and a one-row rank need a second rank to hold the batch; one rank (the smoke run,
  // FUSEJIT_SYNC_WORLDS=1) takes the equal split in their place.
  auto split = [R](Split s) { return R > 1 ? s : Split::equal; };
  const std::vector<Split> kSplits =
      R > 1 ? std::vector<Split>{Split::equal, Split::ragged, Split::empty, Split::single}
            : std::vector<Split>{Split::equal, Split::ragged};
  for (const char* dtype : {"bf16", "fp16", "fp32", "tf32"}) {
    std::vector<Variant> variants{Variant::tiled};
    // Strict fp32 is SIMT FFMA: the warpspec kernels are tensor-core only.
    if (cc == 90 && std::string(dtype) != "fp32") variants.push_back(Variant::warpspec);
    for (const Variant v : variants)
      for (const Split s : kSplits)
        for (const std::int64_t M : {small, large})
          add(M, fmt::format("{} train", dtype), s, v, "");
  }
  for (const Split s : {Split::ragged, split(Split::empty), split(Split::single)})
    for (const std::int64_t M : {small, large})
      add(M, "bf16 train momentum=none", s, Variant::tiled, "");
  for (const std::int64_t M : {small, large}) {
    add(M, "bf16 train", Split::ragged, std::nullopt, "tiled.64x64x64.w2x2.s3.g8.k4");
    add(M, "fp32 train momentum=none", split(Split::single), std::nullopt,
        "tiled.64x64x16.w2x1.s3.g8.k4");
    if (cc == 90) {
      add(M, "bf16 train", Split::ragged, std::nullopt, "warpspec.128x128x64.c2.s5.g8.cl1.p1.pp");
      add(M, "fp16 train", split(Split::single), std::nullopt,
          "warpspec.128x128x64.c2.s6.g8.cl2.p1");
    }
  }
  add(large, "bf16 train non_centred", Split::ragged, std::nullopt, "");
  add(large, "fp16 train same momentum=0.3", split(Split::empty), std::nullopt, "");
  cases[add(large, "bf16 train", Split::ragged, std::nullopt, "")].dump = true;
  // Last: NCCL has set up its connections by then, so the capture records only the collective.
  cases[add(large, "bf16 train", Split::ragged, Variant::tiled, "")].graph = true;
  return cases;
}

// The global batch's inputs, the same on every rank and in the parent (fixed seed).
CaseInputs global_inputs(const SyncCase& c) {
  return make_case_inputs(parse_sweep_line(c.line), c.seed);
}

// The start of a setup error that means "this GPU cannot run the forced config": not a failure.
constexpr const char* kSkip = "skip: ";

// What one rank ran and produced, as raw bytes in the storage types.
struct RankOutput {
  std::size_t case_index = 0;
  std::string error;  // setup failed on some rank (then nothing ran)
  std::int64_t rows = 0;
  Bytes y;                 // [rows][N] of the dtype's storage type
  bool rows_after = true;  // y's rows from `rows` to the plan's M still hold the poison
  Bytes running_mean, running_var, save_mean, save_invstd;
  std::int64_t num_batches_tracked = 0;
};

RankOutput decode(const Bytes& message) {
  multi::Reader r(message);
  RankOutput o;
  o.case_index = r.get<std::uint64_t>();
  o.error = r.get_string();
  o.rows = r.get<std::int64_t>();
  o.y = r.get_vector<unsigned char>();
  o.rows_after = r.get<unsigned char>() != 0;
  o.running_mean = r.get_vector<unsigned char>();
  o.running_var = r.get_vector<unsigned char>();
  o.save_mean = r.get_vector<unsigned char>();
  o.save_invstd = r.get_vector<unsigned char>();
  o.num_batches_tracked = r.get<std::int64_t>();
  if (!r.done()) throw std::runtime_error("rank message: trailing bytes");
  return o;
}

std::vector<double> to_doubles(DType dtype, const Bytes& b) {
  HostTensor t(dtype, b.size() / storage_bytes(dtype));
  if (t.bytes() != b.size()) throw std::runtime_error("rank message: ragged array");
  if (!b.empty()) std::memcpy(t.data(), b.data(), b.size());
  return t.to_doubles();
}

Bytes device_bytes(const void* ptr, std::size_t bytes) {
  Bytes out(bytes);
  if (bytes) FJ_CU(cuMemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(ptr), bytes));
  return out;
}

// ---- one rank -------------------------------------------------------------------------------

// Setup that fails on one rank only (memory, a plan) must not leave the others waiting in the
// plan's collective: the ranks agree first, with a collective of their own, whether all can run.
bool all_ranks_ok(bool ok, ncclComm_t comm, CUstream s) {
  DeviceBuffer flag(sizeof(std::int32_t));
  const std::int32_t mine = ok ? 1 : 0;
  flag.upload(&mine, sizeof mine);
  multi::check_nccl(ncclAllReduce(flag.get(), flag.get(), 1, ncclInt32, ncclMin, comm, s),
                    "ncclAllReduce");
  FJ_CU(cuStreamSynchronize(s));
  std::int32_t all = 0;
  flag.download(&all, sizeof all);
  return all == 1;
}

int run_rank(multi::RankContext& ctx, const std::vector<SyncCase>& cases) {
  primary_context(ctx.rank);  // NCCL takes its device from the current context
  const multi::Communicator comm(ctx);
  const Stream s;
  // Declared after the communicator, so they go first: a plan must not outlive it.
  std::map<std::string, std::unique_ptr<Plan>> plans;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const SyncCase& c = cases[i];
    const CaseInputs global = global_inputs(c);
    const Problem& gp = global.c.problem;
    const std::vector<std::int64_t> rows = split_rows(gp.M, ctx.world, c.split);
    const auto me = static_cast<std::size_t>(ctx.rank);
    std::int64_t first = 0;
    for (std::size_t r = 0; r < me; ++r) first += rows[r];
    const std::int64_t mine = rows[me];

    std::string error;
    std::unique_ptr<DeviceCase> dev;
    const Plan* plan = nullptr;
    try {
      // This rank's case: the plan's M rows of x, its own rows first and NaN after them (a
      // kernel reading past `rows` would show in y or the statistics).
      CaseInputs local = global;
      local.c.problem.M = c.plan_m;
      local.c.problem.stat_ranks = ctx.world;
      const std::size_t row_bytes = static_cast<std::size_t>(gp.lda_x()) * storage_bytes(gp.dtype);
      local.x = HostTensor(gp.dtype, static_cast<std::size_t>(c.plan_m * gp.lda_x()));
      local.x.poison();
      if (mine > 0)
        std::memcpy(local.x.data(),
                    static_cast<const unsigned char*>(global.x.data()) +
                        static_cast<std::size_t>(first) * row_bytes,
                    static_cast<std::size_t>(mine) * row_bytes);
      dev = std::make_unique<DeviceCase>(local);
      PlanOptions o;
      o.device = ctx.rank;
      o.stats_comm = comm.get();
      o.variant = c.variant;
      if (!c.config.empty()) {
        o.config = KernelConfig::parse(c.config);
        // Every rank has the same kind of GPU, so they all skip the case together.
        const std::string why = o.config->why_invalid(local.c.problem, Device::get(ctx.rank));
        if (!why.empty()) throw std::runtime_error(std::string(kSkip) + why);
      }
      const std::string key = local.c.problem.key() + "|" + c.schedule();
      auto& slot = plans[key];
      if (!slot) slot = std::make_unique<Plan>(local.c.problem, o);
      plan = slot.get();
    } catch (const std::exception& e) {
      error = std::string(e.what()).rfind(kSkip, 0) == 0
                  ? std::string(e.what())
                  : fmt::format("rank {}: {}", ctx.rank, e.what());
    }
    if (!all_ranks_ok(error.empty(), comm.get(), s) && error.empty())
      error = fmt::format("rank {}: another rank's setup failed", ctx.rank);

    multi::Writer w;
    w.put(static_cast<std::uint64_t>(i)).put_string(error).put(mine);
    if (!error.empty()) {
      w.put_vector(Bytes{}).put(static_cast<unsigned char>(1));
      for (int k = 0; k < 4; ++k) w.put_vector(Bytes{});
      w.put(std::int64_t{0});
      ctx.send(w);
      continue;
    }
    const Tensors t = dev->tensors();
    if (c.graph) {
      fusejit::test::replay_captured(
          s, [&] { plan->run(s, t, mine); }, 2);
    } else {
      plan->run(s, t, mine);
      s.synchronize();
    }
    const std::size_t eb = storage_bytes(gp.dtype), pb = storage_bytes(gp.param_dtype);
    const auto N = static_cast<std::size_t>(gp.N);
    const Bytes y = device_bytes(t.y, static_cast<std::size_t>(c.plan_m) * N * eb);
    const Bytes mine_y(y.begin(), y.begin() + static_cast<std::ptrdiff_t>(
                                                  static_cast<std::size_t>(mine) * N * eb));
    HostTensor poison(gp.dtype, 1);
    poison.poison();
    bool after = true;
    for (std::size_t b = static_cast<std::size_t>(mine) * N * eb; b < y.size() && after; b += eb)
      after = std::memcmp(&y[b], poison.data(), eb) == 0;
    std::int64_t nbt = 0;
    if (t.num_batches_tracked)
      FJ_CU(cuMemcpyDtoH(&nbt, reinterpret_cast<CUdeviceptr>(t.num_batches_tracked), sizeof nbt));
    w.put_vector(mine_y).put(static_cast<unsigned char>(after ? 1 : 0));
    w.put_vector(device_bytes(t.running_mean, N * pb));
    w.put_vector(device_bytes(t.running_var, N * pb));
    w.put_vector(device_bytes(t.save_mean, N * sizeof(float)));
    w.put_vector(device_bytes(t.save_invstd, N * sizeof(float)));
    w.put(nbt);
    ctx.send(w);
  }
  return 0;
}

// ---- the parent -----------------------------------------------------------------------------

void write_file(const std::filesystem::path& p, const void* data, std::size_t bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  f.close();
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

// The case's inputs and every rank's outputs as raw arrays (row-major, little-endian, storage
// types as named in the manifest) for bench/sync_bn_torch.py --compare.
void dump_case(const std::filesystem::path& dir, const SyncCase& c, const CaseInputs& in,
               const std::vector<std::int64_t>& rows, const std::vector<RankOutput>& out) {
  std::filesystem::create_directories(dir);
  const Problem& p = in.c.problem;
  const std::size_t eb = storage_bytes(p.dtype);
  const auto K = static_cast<std::size_t>(p.K);
  nlohmann::json m;
  m["case"] = c.text();
  m["seed"] = c.seed;
  m["world"] = rows.size();
  m["rows"] = rows;
  m["M"] = p.M, m["N"] = p.N, m["K"] = p.K;
  m["dtype"] = std::string(name(p.dtype));
  m["storage_dtype"] = std::string(name(storage_type(p.dtype)));
  m["param_dtype"] = std::string(name(storage_type(p.param_dtype)));
  m["eps"] = p.eps;
  m["momentum"] = p.momentum ? nlohmann::json(*p.momentum) : nlohmann::json(nullptr);
  m["num_batches_tracked_in"] = in.num_batches_tracked;
  m["num_batches_tracked_out"] = out[0].num_batches_tracked;
  m["config"] = c.schedule();
  auto put = [&](const std::string& key, const std::string& file, const void* data,
                 std::size_t bytes) {
    write_file(dir / file, data, bytes);
    m["files"][key] = file;
  };
  // x is packed here (the sweep case has no row padding): rank r's rows are one span.
  REQUIRE(p.lda_x() == p.K);
  std::size_t first = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto n = static_cast<std::size_t>(rows[r]);
    const std::string sfx = fmt::format(".rank{}.bin", r);
    put(fmt::format("x{}", r), "x" + sfx,
        static_cast<const unsigned char*>(in.x.data()) + first * K * eb, n * K * eb);
    put(fmt::format("y{}", r), "y" + sfx, out[r].y.data(), out[r].y.size());
    put(fmt::format("running_mean{}", r), "running_mean" + sfx, out[r].running_mean.data(),
        out[r].running_mean.size());
    put(fmt::format("running_var{}", r), "running_var" + sfx, out[r].running_var.data(),
        out[r].running_var.size());
    put(fmt::format("save_mean{}", r), "save_mean" + sfx, out[r].save_mean.data(),
        out[r].save_mean.size());
    put(fmt::format("save_invstd{}", r), "save_invstd" + sfx, out[r].save_invstd.data(),
        out[r].save_invstd.size());
    first += n;
  }
  put("w", "w.bin", in.w.data(), in.w.bytes());
  put("bias", "bias.bin", in.bias.data(), in.bias.bytes());
  put("scale", "scale.bin", in.scale.data(), in.scale.bytes());
  put("gamma", "gamma.bin", in.gamma.data(), in.gamma.bytes());
  put("beta", "beta.bin", in.beta.data(), in.beta.bytes());
  put("running_mean_in", "running_mean_in.bin", in.running_mean.data(), in.running_mean.bytes());
  put("running_var_in", "running_var_in.bin", in.running_var.data(), in.running_var.bytes());
  std::ofstream f(dir / "manifest.json");
  f << m.dump(2) << "\n";
  f.close();
  if (!f) throw std::runtime_error("cannot write " + (dir / "manifest.json").string());
  std::printf("  dumped to %s\n", dir.c_str());
}

struct Tally {
  int passed = 0, skipped = 0;
  std::vector<std::string> failures;
};

void check_round(const std::vector<SyncCase>& cases, int R, std::vector<Bytes>& messages,
                 Tally& tally) {
  std::vector<RankOutput> out;
  for (const Bytes& m : messages) out.push_back(decode(m));
  const std::size_t i = out[0].case_index;
  REQUIRE(i < cases.size());
  const SyncCase& c = cases[i];
  bool skip = true;
  for (const RankOutput& o : out) skip = skip && o.error.rfind(kSkip, 0) == 0;
  if (skip) {
    std::printf("  R=%d %-62s skipped (%s)\n", R, c.text().c_str(), out[0].error.c_str());
    ++tally.skipped;
    return;
  }
  std::vector<std::string> why;
  for (const RankOutput& o : out) {
    if (o.case_index != i)
      why.push_back(fmt::format("ranks report different cases ({} and {})", i, o.case_index));
    if (!o.error.empty()) why.push_back(o.error);
  }
  const CaseInputs in = global_inputs(c);
  const Problem& p = in.c.problem;
  const std::vector<std::int64_t> rows = split_rows(p.M, R, c.split);
  double worst = 0;
  if (why.empty()) {
    ReferenceOutputs ref =
        reference_forward(reference_inputs(in), reference_settings(p, in.num_batches_tracked));
    if (c.graph) {  // the second launch: the same batch again, from the first's running stats
      ReferenceInputs again = reference_inputs(in);
      again.running_mean = ref.running_mean;
      again.running_var = ref.running_var;
      ref = reference_forward(again, reference_settings(p, ref.num_batches_tracked));
    }
    CaseOutputs got;
    for (std::size_t r = 0; r < out.size(); ++r) {
      if (out[r].rows != rows[r])
        why.push_back(fmt::format("rank {} ran {} rows, expected {}", r, out[r].rows, rows[r]));
      const std::vector<double> y = to_doubles(p.dtype, out[r].y);
      got.y.insert(got.y.end(), y.begin(), y.end());
      if (!out[r].rows_after) why.push_back(fmt::format("rank {} wrote y past its rows", r));
      // The statistics are one merge in rank order on every rank: the same bits, not close.
      if (r > 0) {
        auto same = [&](const Bytes& a, const Bytes& b, const char* what) {
          if (a != b)
            why.push_back(fmt::format("rank {}'s {} differs from rank 0's (bitwise)", r, what));
        };
        same(out[r].running_mean, out[0].running_mean, "running_mean");
        same(out[r].running_var, out[0].running_var, "running_var");
        same(out[r].save_mean, out[0].save_mean, "save_mean");
        same(out[r].save_invstd, out[0].save_invstd, "save_invstd");
        if (out[r].num_batches_tracked != out[0].num_batches_tracked)
          why.push_back(fmt::format("rank {}'s num_batches_tracked {} != rank 0's {}", r,
                                    out[r].num_batches_tracked, out[0].num_batches_tracked));
      }
    }
    got.running_mean = to_doubles(p.param_dtype, out[0].running_mean);
    got.running_var = to_doubles(p.param_dtype, out[0].running_var);
    got.save_mean = to_doubles(DType::fp32, out[0].save_mean);
    got.save_invstd = to_doubles(DType::fp32, out[0].save_invstd);
    got.num_batches_tracked = out[0].num_batches_tracked;
    const CaseErrors e = compare(in, got, ref);
    worst = e.worst();
    std::string fail;
    if (!passes(e, sweep_threshold(p.dtype), &fail)) why.push_back(fail);
    if (c.dump)
      if (const char* dir = std::getenv("FUSEJIT_SYNC_DUMP_DIR"); dir && *dir)
        dump_case(dir, c, in, rows, out);
  }
  std::string split;
  for (const std::int64_t r : rows) split += (split.empty() ? "" : ",") + std::to_string(r);
  std::printf("  R=%d %-62s rows %-22s worst %.2e  %s\n", R, c.text().c_str(), split.c_str(), worst,
              why.empty() ? "ok" : "FAILED");
  std::fflush(stdout);
  if (why.empty()) {
    ++tally.passed;
    return;
  }
  std::string all;
  for (const auto& w : why) all += (all.empty() ? "" : "; ") + w;
  tally.failures.push_back(fmt::format("R={} {}: {}", R, c.text(), all));
}

}  // namespace

TEST_CASE("synchronized statistics over R ranks match one float64 batch, the same bits on each") {
  const multi::GpuProbe gpus = multi::probe_gpus();
  // FUSEJIT_SYNC_WORLDS (e.g. "1" or "2,4") replaces the rank counts: 1 runs the whole harness
  // (launcher, communicator, exchange, checks, dump) on one GPU as a smoke test.
  std::vector<int> worlds;
  if (const char* w = std::getenv("FUSEJIT_SYNC_WORLDS"); w && *w) {
    const std::string list(w);
    for (std::size_t at = 0;;) {
      const std::size_t comma = list.find(',', at);
      worlds.push_back(std::stoi(list.substr(at, comma - at)));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  } else {
    worlds.push_back(2);
    if (gpus.count >= 4) worlds.push_back(4);
  }
  const int needed = *std::max_element(worlds.begin(), worlds.end());
  if (gpus.count < needed) {
    std::printf("SKIPPED: synchronized statistics over %d ranks need %d GPUs; %s\n", needed, needed,
                gpus.count == 0 ? gpus.why.c_str() : "this machine has fewer");
    std::fflush(nullptr);
    std::_Exit(77);  // ctest's SKIP_RETURN_CODE: doctest has no skip of its own
  }
  REQUIRE_MESSAGE(gpus.min_cc >= 80, "fusejit needs sm_80 or newer on every GPU");
  for (const int R : worlds) {
    const std::vector<SyncCase> cases = make_cases(R, gpus.min_cc);
    std::printf("R=%d: %zu cases on GPUs 0..%d\n", R, cases.size(), R - 1);
    Tally tally;
    const multi::LaunchResult res = multi::launch_ranks(
        R, [&cases](multi::RankContext& ctx) { return run_rank(ctx, cases); },
        [&](std::vector<Bytes>& m) { check_round(cases, R, m, tally); }, 600.0);
    std::printf("R=%d: %d of %zu cases passed, %d skipped (config invalid on this GPU)\n", R,
                tally.passed, cases.size(), tally.skipped);
    for (const auto& f : tally.failures) FAIL_CHECK(f);
    std::string codes;
    for (const int code : res.exit_codes) codes += " " + std::to_string(code);
    // A rank that throws (its reason is on stderr) leaves the others in the case's collective.
    const std::string stuck = res.rounds < static_cast<int>(cases.size())
                                  ? "; the first case without results: " +
                                        cases[static_cast<std::size_t>(res.rounds)].text()
                                  : "";
    CHECK_MESSAGE(res.ok(),
                  fmt::format("ranks' exit codes{}; {} rounds of {}{}{}{}", codes, res.rounds,
                              cases.size(), stuck, res.timed_out ? "; timed out" : "",
                              res.problems.empty() ? "" : "; " + res.problems));
    CHECK(res.rounds == static_cast<int>(cases.size()));
  }
}
