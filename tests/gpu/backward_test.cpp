// The backward pass (BackwardPlan) against the float64 reference, through the case runner the
// `fusejit check --backward` command uses (tools/backward_check.hpp): the forward runs first with
// Tensors::saved and the backward reads what it saved, as a training step would. Every gradient
// of every dtype x mode, tails in M, N and K, M = 2, absent bias / scale / affine, gamma = 0 and
// scale = 0 columns, strided tensors, large column means, fewer rows than the plan's M,
// accumulation, skipped outputs left untouched, and bad input named.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusejit/backward.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/device/driver.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fusejit/util/fault.hpp"
#include "gpu_required.hpp"
#include "test_tempdir.hpp"
#include "tools/backward_check.hpp"

FUSEJIT_GPU_TEST_EXECUTABLE;

using namespace fusejit;

namespace {

// The case against float64, through the case runner; returns its result (the config it ran).
BackwardCheckResult check(const std::string& line, const BackwardCheckOptions& o = {}) {
  CAPTURE(line);
  const SweepCase c = parse_sweep_line(line);
  const BackwardCheckResult r = check_backward_case(c, o);
  std::string why;
  const bool ok = passes(r, sweep_threshold(c.problem.dtype), &why);
  CAPTURE(r.seed);
  CAPTURE(r.config);
  CAPTURE(why);
  MESSAGE(
      fmt::format("{}: saved {:.2e} dx {:.2e} dw {:.2e} dbias {:.2e} dscale {:.2e} dgamma "
                  "{:.2e} dbeta {:.2e}",
                  line, r.errors.saved, r.errors.dx, r.errors.dw, r.errors.dbias, r.errors.dscale,
                  r.errors.dgamma, r.errors.dbeta));
  CHECK(ok);
  return r;
}

// Both gradient GEMMs forced to (dx, dw) on every line, then an accumulating run of `accumulate`
// and a 129-row run of `rows`' plan.
void check_forced(const char* dx, const char* dw, const std::vector<std::string>& lines,
                  const char* accumulate, const char* rows) {
  CAPTURE(dx);
  CAPTURE(dw);
  BackwardCheckOptions o;
  o.dx_config = KernelConfig::parse(dx);
  o.dw_config = KernelConfig::parse(dw);
  for (const std::string& line : lines) check(line, o);
  BackwardCheckOptions a = o;
  a.accumulate = true;
  check(accumulate, a);
  BackwardCheckOptions r = o;
  r.rows = 129;
  check(rows, r);
}

// A training step's device tensors beside a DeviceCase's inputs: the forward's saved output, a
// random dy, and a buffer for every gradient, wired into both runs' tensors (for problems with
// bias, scale and affine: a BackwardPlan refuses gradients of parameters a problem lacks).
struct StepTensors {
  DeviceBuffer saved, dy, dx, dw, dgamma, dbias, dscale, dbeta;
  Tensors fwd;
  BackwardTensors bwd;
  StepTensors(const Problem& p, DeviceCase& dev)
      : saved(static_cast<std::size_t>(p.M * p.lda_y()) * storage_bytes(p.dtype)),
        dy(saved.size()),
        dx(static_cast<std::size_t>(p.M * p.lda_x()) * storage_bytes(p.dtype)),
        dw(static_cast<std::size_t>(p.N * p.lda_w()) * storage_bytes(p.dtype)),
        dgamma(static_cast<std::size_t>(p.N) * storage_bytes(p.param_dtype)),
        dbias(dgamma.size()),
        dscale(dgamma.size()),
        dbeta(dgamma.size()),
        fwd(dev.tensors()) {
    HostTensor h(storage_type(p.dtype), static_cast<std::size_t>(p.M * p.lda_y()));
    fill_normal(h, 0.0, 1.0);
    dy.upload(h.data(), h.bytes());
    fwd.saved = saved.get();
    bwd.dy = dy.get(), bwd.x = fwd.x, bwd.w = fwd.w, bwd.saved = saved.get();
    bwd.scale = fwd.scale, bwd.gamma = fwd.gamma;
    if (p.mode == Mode::train) {
      bwd.save_mean = fwd.save_mean, bwd.save_invstd = fwd.save_invstd;
    } else {
      bwd.running_mean = fwd.running_mean, bwd.running_var = fwd.running_var;
    }
    bwd.dx = dx.get(), bwd.dw = dw.get(), bwd.dgamma = dgamma.get(), bwd.dbias = dbias.get();
    bwd.dscale = dscale.get(), bwd.dbeta = dbeta.get();
  }
};

// One layer's training step: its inputs on the device, the heuristic's forward and backward plans,
// the step's tensors and a stream.
struct StepCase {
  SweepCase c;
  CaseInputs in;
  DeviceCase dev;
  Plan forward;
  BackwardPlan backward;
  StepTensors t;
  Stream s;
  explicit StepCase(const char* line)
      : c(parse_sweep_line(line)),
        in(make_case_inputs(c)),
        dev(in),
        forward(c.problem),
        backward(c.problem),
        t(c.problem, dev) {}
  // Waits for the stream, downloads each of `outs` and poisons it again.
  std::vector<std::vector<unsigned char>> snapshot(const std::vector<DeviceBuffer*>& outs) {
    s.synchronize();
    std::vector<std::vector<unsigned char>> v;
    for (DeviceBuffer* b : outs) v.push_back(b->download_bytes());
    for (DeviceBuffer* b : outs) b->fill_words(nan_word(c.problem.dtype));
    return v;
  }
};

}  // namespace

TEST_CASE("backward: the built-in sweep (every dtype x mode, tails, flags, strides)") {
  for (const std::string& line : builtin_backward_sweep(false)) check(line);
}

TEST_CASE("backward: gamma = 0 and scale = 0 columns") {
  for (const char* mode : {"train", "eval"}) {
    BackwardCheckOptions g;
    g.zero_gamma_column = 3;
    check(fmt::format("300x64x64 bf16 {}", mode), g);
    BackwardCheckOptions s;
    s.zero_scale_column = 5;
    check(fmt::format("300x64x64 bf16 {}", mode), s);
  }
}

// tf32 too: on Hopper its gradient GEMMs read K-major copies whose row strides follow the run's
// rows, and a skipped dX or dW skips its copies.
TEST_CASE("backward: fewer rows than the plan's M, accumulation, skipped outputs") {
  for (const char* dtype : {"bf16", "tf32"})
    for (const char* mode : {"train", "eval"}) {
      BackwardCheckOptions r;
      r.rows = 300;
      check(fmt::format("1000x64x96 {} {}", dtype, mode), r);
      BackwardCheckOptions a;
      a.accumulate = true;
      check(fmt::format("300x64x96 {} {}", dtype, mode), a);
      BackwardCheckOptions nx;
      nx.want_dx = false;
      check(fmt::format("300x64x96 {} {}", dtype, mode), nx);
      BackwardCheckOptions np;
      np.want_dw = false;
      np.want_params = false;
      check(fmt::format("300x64x96 {} {}", dtype, mode), np);
      // Only the parameter gradients: train launches no fj_bwd_da then.
      BackwardCheckOptions po;
      po.want_dx = false;
      po.want_dw = false;
      check(fmt::format("300x64x96 {} {}", dtype, mode), po);
    }
}

TEST_CASE("backward: forced gradient GEMM tiles, and configs it cannot take") {
  BackwardCheckOptions o;
  o.dx_config = KernelConfig::parse("tiled.128x128x32.w2x2.s4.g8");
  o.dw_config = KernelConfig::parse("tiled.64x128x64.w2x2.s3.g4");
  check("1000x200x136 bf16 train", o);
  check("1000x200x136 fp16 eval", o);
  const Problem p = parse_sweep_line("256x64x64 bf16 train").problem;
  const Problem tf32x3 = parse_sweep_line("256x64x64 tf32x3 train").problem;
  // Rows TMA cannot load run on copies, but not with TMA stores: dA's rows of 120 bytes (and y's,
  // the one alignment promise); x and W rows of 264 bytes (8-byte aligned) while K = 64 would take
  // TMA stores packed; odd K in a 16-bit type.
  const Problem narrow = parse_sweep_line("256x60x64 bf16 train").problem;
  const Problem tf32_8 = parse_sweep_line("256x64x64 tf32 train ldx=66 ldw=66").problem;
  const Problem odd = parse_sweep_line("256x64x65 bf16 train").problem;
  struct Refused {
    const Problem* problem;
    const char* key;
  };
  for (const Refused& r :
       {Refused{&p, "warpspec.128x128x64.c2.s5.g8.cl2.p1"},
        Refused{&p, "warpspec.128x128x64.c2.s5.g8.cl1.p1.pp"},
        Refused{&p, "warpspec.128x256x64.c2.s5.g8.cl1.p1.ts"} /* stages exceed smem */,
        Refused{&tf32x3, "warpspec.128x128x32.c2.s5.g8.cl1.p1"} /* strict fp32 gradients */,
        Refused{&narrow, "warpspec.128x128x64.c2.s4.g8.cl1.p1.ts"},
        Refused{&p, "tiled.64x64x64.w2x2.s3.g8.k64"} /* above kMaxSplitK */,
        Refused{&p, "warpspec.64x64x64.c1.s8.g8.cl1.p1.k2.ts"} /* slices need thread stores */,
        Refused{&p, "tiled.64x64x64.w2x2.s3.g8.xm"},
        Refused{&tf32_8, "warpspec.128x128x32.c1.s4.g8.cl1.p1.ts"} /* dW rows 8-byte aligned */,
        Refused{&odd, "warpspec.64x128x64.c1.s6.g8.cl1.p0.ts"} /* C rows 2-byte aligned */}) {
    CAPTURE(r.key);
    BackwardOptions bo;
    bo.dw_config = KernelConfig::parse(r.key);
    try {
      const BackwardPlan plan(*r.problem, bo);
      FAIL("no error");
    } catch (const InvalidArgument& e) {
      CHECK(e.argument() == "dw_config");
    }
  }
}

// Strict fp32 and tf32x3 run both gradient GEMMs on cuBLASLt by default; any dtype may force
// either onto it (BackwardOptions::dx_cublaslt, dw_cublaslt), beside the other GEMM's tiles.
TEST_CASE("backward: gradient GEMMs on cuBLASLt") {
  for (const char* line : {"1000x200x136 fp32 train", "300x72x40 fp32 eval",
                           "257x64x96 tf32x3 train", "300x60x65 fp32 train ldx=70 ldw=68"}) {
    CAPTURE(std::string(line));
    CHECK(check(line).config == "dx.cublaslt.dw.cublaslt");
  }
  struct Forced {
    bool dx, dw;
  };
  for (const Forced f : {Forced{true, true}, Forced{true, false}, Forced{false, true}})
    for (const char* line :
         {"1000x200x136 bf16 train", "300x72x40 fp16 eval", "513x64x96 tf32 train",
          "300x60x65 bf16 train", "257x64x96 bf16 train ldx=100"}) {
      CAPTURE(f.dx);
      CAPTURE(f.dw);
      BackwardCheckOptions o;
      o.dx_cublaslt = f.dx;
      o.dw_cublaslt = f.dw;
      check(line, o);
    }
  // Fewer rows than the plan's (the layouts of the run's rows, the plan's algorithm),
  // accumulation (dW += ...), and each GEMM skipped.
  for (const char* dtype : {"fp32", "bf16"})
    for (const char* mode : {"train", "eval"}) {
      BackwardCheckOptions o;
      o.dx_cublaslt = o.dw_cublaslt = true;
      BackwardCheckOptions r = o;
      r.rows = 129;
      check(fmt::format("1000x64x96 {} {}", dtype, mode), r);
      r.rows = 2;
      check(fmt::format("1000x64x96 {} {}", dtype, mode), r);
      BackwardCheckOptions a = o;
      a.accumulate = true;
      check(fmt::format("300x64x96 {} {}", dtype, mode), a);
      BackwardCheckOptions nx = o;
      nx.want_dx = false;
      check(fmt::format("300x64x96 {} {}", dtype, mode), nx);
      BackwardCheckOptions nw = o;
      nw.want_dw = false;
      check(fmt::format("300x64x96 {} {}", dtype, mode), nw);
    }
  // A GEMM runs on cuBLASLt or on forced tiles, not both.
  const Problem p = parse_sweep_line("256x64x64 bf16 train").problem;
  BackwardOptions both;
  both.dw_cublaslt = true;
  both.dw_config = KernelConfig::parse("tiled.64x128x64.w2x2.s3.g4");
  try {
    const BackwardPlan plan(p, both);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "dw_cublaslt");
  }
}

// Where cuBLASLt declines a GEMM that the heuristic, not the caller, put on it, the plan runs the
// heuristic's tiles for it (lt_declined_fallback); a GEMM the caller forced onto cuBLASLt fails
// as asked. The refusal is Fault::lt_no_algorithm: no layer cuBLASLt declines is known.
TEST_CASE("backward: a GEMM cuBLASLt declines runs on the heuristic's tiles") {
  // A fault left armed by a failing check must not reach the cases after this one.
  struct Disarm {
    ~Disarm() { fault::disarm_all(); }
  } disarm;
  // A cache of its own: no tuning entry can stand in for the heuristic's pair.
  const test::TempDir cache;
  BackwardCheckOptions o;
  o.cache_dir = cache.str();
  const Device device = Device::get(0);
  // Strict fp32 puts both GEMMs on cuBLASLt on every GPU, so the case never skips them all.
  for (const char* line :
       {"1000x200x136 fp32 train", "2100x1024x1024 bf16 train", "600x4096x1024 fp16 train"}) {
    CAPTURE(std::string(line));
    const Problem p = parse_sweep_line(line).problem;
    const BackwardConfig heuristic = default_backward_config(p, device);
    const BackwardConfig tiles = default_backward_tiles(p, device);
    // The class's choice is settled first (its cuBLASLt GEMMs asked about; declined, the
    // heuristic's tiles), then the plan's own M may move dX to cuBLASLt (plan_backward_config),
    // asked about in turn, unless the class had put dX there already.
    const bool class_lt = heuristic.dx_cublaslt || heuristic.dw_cublaslt;
    const BackwardConfig settled = class_lt ? tiles : heuristic;
    const BackwardConfig moved = plan_backward_config(p, settled, device);
    const bool moves = !heuristic.dx_cublaslt && moved.dx_cublaslt != settled.dx_cublaslt;
    if (!class_lt && !moves) {
      MESSAGE("skipped: the heuristic runs both GEMMs on tiles on this GPU");
      continue;
    }
    const int before = fault::fired(Fault::lt_no_algorithm);
    const int declines = (class_lt ? 1 : 0) + (moves ? 1 : 0);
    fault::arm(Fault::lt_no_algorithm, declines);
    const BackwardCheckResult r = check(line, o);
    fault::arm(Fault::lt_no_algorithm, 0);
    CHECK(fault::fired(Fault::lt_no_algorithm) == before + declines);
    CHECK(r.config == tiles.key());
    if (class_lt && moves) {
      // Only the class's GEMM declined: the moved dX still runs on cuBLASLt.
      fault::arm(Fault::lt_no_algorithm, 1);
      CHECK(check(line, o).config == moved.key());
      fault::arm(Fault::lt_no_algorithm, 0);
    }
    BackwardOptions forced;
    forced.cache_dir = cache.str();
    forced.dx_cublaslt = heuristic.dx_cublaslt || moves;
    forced.dw_cublaslt = heuristic.dw_cublaslt;
    fault::arm(Fault::lt_no_algorithm, fault::kAlways);
    CHECK_THROWS_AS(BackwardPlan(p, forced), CudaError);
    fault::arm(Fault::lt_no_algorithm, 0);
  }
}

// A run of a row count that cuBLASLt was not asked about when the plan was made is checked
// before anything is enqueued (LtGemm::runs_rows): a refusal (Fault::lt_rows_refused; no count
// cuBLASLt refuses is known) throws and leaves every output as it was, accumulated dW and
// parameter gradients included; once cuBLASLt accepts the count it is not asked again.
TEST_CASE("backward: a row count cuBLASLt refuses throws before anything is enqueued") {
  struct Disarm {
    ~Disarm() { fault::disarm_all(); }
  } disarm;
  // Strict fp32 runs both gradient GEMMs on cuBLASLt on every GPU. 700 rows is none of the
  // counts checked at plan time for M = 1000 (2, the powers of two, 501, 999).
  StepCase k("1000x200x136 fp32 train");
  const Problem& p = k.c.problem;
  BackwardOptions o;
  o.accumulate = true;
  const BackwardPlan plan(p, o);
  REQUIRE(plan.config_key() == "dx.cublaslt.dw.cublaslt");
  const std::int64_t rows = 700;
  StepTensors& t = k.t;
  k.forward.run(k.s, t.fwd, rows);
  std::vector<DeviceBuffer*> outs{&t.dx, &t.dw, &t.dgamma, &t.dbias, &t.dscale, &t.dbeta};
  for (DeviceBuffer* b : outs) {
    HostTensor h(storage_type(DType::fp32), b->size() / sizeof(float));
    fill_normal(h, 0.0, 1.0);
    b->upload(h.data(), h.bytes());
  }
  auto download = [&] {
    k.s.synchronize();
    std::vector<std::vector<unsigned char>> v;
    for (DeviceBuffer* b : outs) v.push_back(b->download_bytes());
    return v;
  };
  const auto before = download();
  const int fired = fault::fired(Fault::lt_rows_refused);
  fault::arm(Fault::lt_rows_refused, fault::kAlways);
  try {
    plan.run(k.s, t.bwd, rows);
    FAIL("no error");
  } catch (const CudaError& e) {
    CAPTURE(std::string(e.what()));
    CHECK(std::string(e.what()).find("dX GEMM does not run 700 rows") != std::string::npos);
    CHECK(std::string(e.what()).find("nothing was enqueued") != std::string::npos);
  }
  CHECK(fault::fired(Fault::lt_rows_refused) == fired + 1);
  CHECK(download() == before);
  // Accepted once, the count is remembered: the armed fault is not reached again.
  fault::arm(Fault::lt_rows_refused, 0);
  plan.run(k.s, t.bwd, rows);
  CHECK(download() != before);
  fault::arm(Fault::lt_rows_refused, fault::kAlways);
  CHECK_NOTHROW(plan.run(k.s, t.bwd, rows));
  CHECK(fault::fired(Fault::lt_rows_refused) == fired + 1);
}

// cache_hit() is the plan's own story, as Plan's: the first plan of a layer compiles into an
// empty cache, a second one finds the kernel set the first loaded.
TEST_CASE("backward: cache_hit says whether making this plan compiled its kernels") {
  const test::TempDir cache;
  BackwardOptions o;
  o.cache_dir = cache.str();
  // A layer no other case of this program runs: "first" must be the first in the process too
  // (a kernel set another case loaded is an in-process hit whatever the cache directory).
  const Problem p = parse_sweep_line("300x88x56 bf16 train").problem;
  const BackwardPlan first(p, o);
  CHECK_FALSE(first.cache_hit());
  const BackwardPlan second(p, o);
  CHECK(second.cache_hit());
}

// The heuristic chooses dX's tiles for an M class; a plan whose own M leaves those tiles' grid
// using 62% or less of its waves' SM slots runs dX on cuBLASLt instead (plan_backward_config) on
// the class's kernel set: after a plan of the class's M compiled the set, it compiles nothing,
// names no dX kernel, and its gradients (of all its rows and of fewer) pass. A forced dX keeps its
// tiles; an entry tuned at another M of the class moves like the heuristic's choice, one tuned at
// this M does not.
TEST_CASE("backward: a plan's own M moves dX to cuBLASLt on its M class's kernel set") {
  const test::TempDir cache;  // no tuning entry: the heuristic's choice
  const Device device = Device::get(0);
  const char* line = "512x2048x2048 bf16 train";
  const Problem small = parse_sweep_line(line).problem;
  // Its class's M. No other case of this program loads this kernel set, so the first plan of it
  // compiles (a set another case loaded would be an in-process hit whatever the directory).
  const Problem whole = parse_sweep_line("1024x2048x2048 bf16 train").problem;
  const BackwardConfig c = default_backward_config(small, device);
  if (c.dx_cublaslt || !plan_backward_config(small, c, device).dx_cublaslt) {
    // Measured and ruled on Hopper's 132 SMs only (H100, H200).
    REQUIRE((device.cc_major != 9 || device.sm_count != 132));
    MESSAGE("skipped: the rule keeps 512x2048x2048's dX on tiles on this GPU");
    return;
  }
  BackwardOptions o;
  o.cache_dir = cache.str();
  const BackwardPlan first(whole, o);
  CHECK(first.config_key() == c.key());
  CHECK_FALSE(first.cache_hit());
  const BackwardPlan moved(small, o);
  CHECK(moved.dispatch() == "heuristic");
  CHECK(moved.config_key() == "dx.cublaslt.dw." + c.dw.key());
  CHECK(moved.cache_hit());
  const std::vector<std::string> names = moved.kernel_names();
  CHECK(std::ranges::find(names, "fj_bwd_dx") == names.end());
  CHECK(std::ranges::find(names, "fj_bwd_dw") != names.end());
  CHECK(std::ranges::find(names, "cublasLtMatmul (dx)") != names.end());
  BackwardCheckOptions co;
  co.cache_dir = cache.str();
  CHECK(check(line, co).config == moved.config_key());
  co.rows = 300;
  CHECK(check(line, co).config == moved.config_key());
  BackwardCheckOptions forced;
  forced.cache_dir = cache.str();
  forced.dx_config = c.dx;
  CHECK(check(line, forced).config == c.key());
  // An entry tuned at the class's M (recorded here as `fusejit autotune --backward` records one)
  // reaches this M as "m-class", and its dX moves alike; an entry tuned at this M timed its dX
  // here and does not move.
  const test::TempDir tuned;
  const TuningDb db = TuningDb::for_device(device, tuned.str());
  TuningEntry e;
  e.problem = backward_entry_problem(whole);
  e.winner = c.key();
  e.winner_ms = 1;
  e.best_fused = e.winner;  // the database's rule for a fused winner
  e.best_fused_ms = e.winner_ms;
  e.timestamp = 1;
  REQUIRE(db.record(e, TunedPass::backward));
  BackwardOptions t;
  t.cache_dir = tuned.str();
  const BackwardPlan other_m(small, t);
  CHECK(other_m.dispatch() == "m-class");
  CHECK(other_m.config_key() == moved.config_key());
  e.problem = backward_entry_problem(small);
  REQUIRE(db.record(e, TunedPass::backward));
  const BackwardPlan own_m(small, t);
  CHECK(own_m.dispatch() == "tuned");
  CHECK(own_m.config_key() == c.key());
}

TEST_CASE("backward: a training step whose forward is the cuBLASLt reference op") {
  // Strict fp32 at K >= 1536: the heuristic's forward is the reference op,
  // which writes saved for the backward; the device's tuning database has no entry for these.
  for (const char* line : {"600x1100x2000 fp32 train", "600x1100x2000 fp32 train momentum=none",
                           "300x1024x2048 fp32 train nobias", "300x700x2048 fp32 eval"}) {
    CAPTURE(std::string(line));
    BackwardCheckOptions o;
    o.use_tuning_db = false;  // the heuristic's forward, whatever the device's database holds
    const BackwardCheckResult r = check(line, o);
    CHECK(r.forward_reference);
    CHECK(r.config == "dx.cublaslt.dw.cublaslt");
  }
  // A batch of fewer rows than the plans' M.
  BackwardCheckOptions o;
  o.use_tuning_db = false;
  o.rows = 257;
  CHECK(check("600x1100x2000 fp32 train", o).forward_reference);
}

TEST_CASE("backward: warpspec gradient GEMMs (sm_90a): tile shapes, tails, persistent or not") {
  if (Device::get(0).cc() != 90) {
    MESSAGE("skipped: the warpspec gradient GEMMs need sm_90a");
    return;
  }
  struct Tiles {
    const char *dx, *dw;
  };
  for (const Tiles& t :
       {Tiles{"warpspec.128x256x64.c2.s4.g16.cl1.p1", "warpspec.128x256x64.c2.s4.g16.cl1.p0"},
        Tiles{"warpspec.64x128x64.c1.s6.g8.cl1.p0", "warpspec.64x128x64.c1.s6.g8.cl1.p1"},
        Tiles{"warpspec.128x64x64.c2.s6.g8.cl1.p1", "warpspec.128x128x64.c1.s4.g8.cl1.p1"},
        Tiles{"warpspec.256x128x64.c2.s3.g8.cl1.p1", "warpspec.64x64x64.c1.s8.g8.cl1.p1"},
        {"warpspec.128x256x64.c2.s4.g16.cl1.p1.ts", "warpspec.64x128x64.c1.s6.g8.cl1.p0.ts"},
        {"warpspec.128x128x64.c1.s4.g8.cl1.p1.ts", "warpspec.128x64x64.c2.s6.g8.cl1.p0.ts"}})
    check_forced(t.dx, t.dw,
                 {"1000x200x136 bf16 train", "300x72x40 fp16 eval", "2x24x16 bf16 train",
                  "777x328x520 bf16 eval", "1000x64x256 fp16 train non_centred"},
                 "300x136x96 bf16 train", "1000x64x96 bf16 eval");
  // tf32 on its K-major copies: TMA and thread stores (fp32 C), one and two consumers.
  check_forced("warpspec.128x256x32.c2.s4.g16.cl1.p1.ts", "warpspec.128x128x32.c1.s4.g8.cl1.p1",
               {"1000x200x136 tf32 train", "300x72x40 tf32 eval", "2x24x16 tf32 train",
                "777x328x520 tf32 eval"},
               "300x136x96 tf32 train", "1000x64x96 tf32 eval");
  // tf32 whose x and W rows are 8-byte aligned, not 16 (K = 2 mod 4, padded strides, odd K with
  // padded ones): the copies are padded, so only C's stores see the layer's rows (pairs of fp32,
  // a last odd column alone; no TMA stores).
  check_forced("warpspec.128x256x32.c2.s3.g16.cl1.p1", "warpspec.128x128x32.c1.s4.g8.cl1.p1",
               {"1000x200x138 tf32 train", "300x72x42 tf32 eval", "2x24x18 tf32 train",
                "300x72x40 tf32 train ldx=42 ldw=46 ldy=76", "777x328x522 tf32 eval",
                "300x72x41 tf32 train ldx=42 ldw=42" /* odd K: C's last column alone */},
               "300x136x97 tf32 train ldx=98 ldw=98", "1000x64x98 tf32 eval");
  // tf32 whose rows are only 4-byte aligned (odd K) or whose N is not a multiple of 4 (dA's rows,
  // padded where fj_bwd_da writes them): C's stores one element at a time.
  check_forced("warpspec.128x128x32.c2.s6.g8.cl1.p1", "warpspec.64x128x32.c1.s6.g8.cl1.p0",
               {"301x71x41 tf32 train", "300x70x40 tf32 eval", "2x23x17 tf32 train",
                "777x330x521 tf32 train"},
               "300x70x41 tf32 train", "1000x66x97 tf32 eval");
  // 16-bit layers whose rows TMA cannot load (odd K and N, K % 8 in 1..7, padded strides, N = 60
  // with K's rows aligned: y's rows bound the alignment promise): x and W through K-major copies,
  // dA in place from its padded rows (MN-major for dW), dx and dW stored an element at a time
  // where their rows need it; split and unsplit.
  const std::vector<std::string> unaligned = {"301x71x41 bf16 train",
                                              "300x72x44 fp16 eval",
                                              "2x23x17 bf16 train",
                                              "777x330x521 fp16 train",
                                              "300x72x40 bf16 eval ldx=44",
                                              "1000x60x64 bf16 train",
                                              "1000x200x138 fp16 eval ldw=139",
                                              "4097x127x129 bf16 train non_centred"};
  check_forced("warpspec.128x256x64.c2.s4.g16.cl1.p1", "warpspec.128x128x64.c2.s6.g8.cl1.p1",
               unaligned, "300x70x41 bf16 train", "1000x66x97 fp16 eval");
  check_forced("warpspec.64x128x64.c1.s6.g8.cl1.p0.k4", "warpspec.64x64x64.c1.s8.g8.cl1.p1.k8",
               unaligned, "300x70x41 fp16 train", "1000x66x97 bf16 eval");
  // The heuristic splits dW of a narrow 8-byte-aligned tf32 layer (fp32 slices, then the sum).
  check("4100x40x26 tf32 train");
  // The heuristic takes warpspec there too, and for unaligned 16-bit layers.
  for (const char* line :
       {"777x1536x2050 tf32 train", "777x1536x2050 tf32 eval", "777x1536x2050 bf16 train",
        "4097x4095x129 bf16 train", "4097x4095x129 fp16 eval"}) {
    CHECK(BackwardPlan(parse_sweep_line(line).problem).config_key().find("tiled") ==
          std::string::npos);
    check(line);
  }
}

// Split-K gradient GEMMs (fp32 slices, then kernels/grad_split_sum.cuh), forced on both GEMMs:
// tails in every dimension, splits beyond a run's k tiles (those store zeros), fewer rows than the
// plan's M, accumulation into dW, and bit-identical results run to run (the sum's fixed order).
TEST_CASE("backward: split-K gradient GEMMs, tiled and warpspec") {
  struct Tiles {
    const char *dx, *dw;
  };
  std::vector<Tiles> tiles = {{"tiled.64x64x64.w2x2.s3.g8.k2", "tiled.64x128x64.w2x2.s3.g8.k5"},
                              {"tiled.128x128x32.w2x2.s4.g8.k3", "tiled.64x64x64.w2x2.s3.g8.k32"}};
  if (Device::get(0).cc() == 90) {
    tiles.push_back(
        {"warpspec.128x256x64.c2.s4.g16.cl1.p1.k4", "warpspec.64x64x64.c1.s8.g8.cl1.p1.k32"});
    tiles.push_back(
        {"warpspec.64x128x64.c1.s6.g8.cl1.p0.k3", "warpspec.128x128x64.c2.s4.g8.cl1.p1.k7"});
    // dW in one consumer's 64x128 tiles, split: the heuristic's pick for layers like 16384x512x128.
    tiles.push_back(
        {"warpspec.128x128x64.c2.s6.g8.cl1.p1.ts", "warpspec.64x128x64.c1.s6.g8.cl1.p1.k16"});
  } else {
    MESSAGE("warpspec split configs skipped: they need sm_90a");
  }
  for (const Tiles& t : tiles) {
    std::vector<std::string> lines = {"1000x200x136 bf16 train", "300x72x40 fp16 eval",
                                      "2x24x16 bf16 train", "4097x328x520 bf16 eval",
                                      "3000x64x256 fp16 train non_centred"};
    // K = 13 (rows of 26 bytes): warpspec reads copies of x and W, without TMA stores.
    if (!KernelConfig::parse(t.dx).tma_store && !KernelConfig::parse(t.dw).tma_store)
      lines.push_back("777x96x13 bf16 train");
    check_forced(t.dx, t.dw, lines, "1300x136x96 bf16 train", "3000x64x96 bf16 eval");
  }
}

// tf32's tiled gradient GEMMs, the ones every GPU but sm_90a trains tf32 layers with (the
// heuristic's tiles there: 128x256 with eight warps where its stages fit shared memory, else
// 128x128 with four; smaller and split ones are tuning candidates), forced here on any GPU. Their
// MN-major operands (W for dX, da and x for dW) are copied an element at a time into the K-major
// stage from a few base offsets a thread (mainloop/element_passes.h): tails in every dimension,
// 4-byte aligned rows, split and unsplit.
TEST_CASE("backward: tiled tf32 gradient GEMMs (MN-major copies turned around)") {
  struct Tiles {
    const char *dx, *dw;
  };
  for (const Tiles& t : {Tiles{"tiled.128x256x32.w2x4.s3.g8", "tiled.128x256x32.w2x4.s3.g8"},
                         Tiles{"tiled.128x128x32.w2x2.s3.g8", "tiled.128x128x32.w2x2.s3.g8"},
                         Tiles{"tiled.64x64x32.w2x2.s3.g8", "tiled.128x64x32.w4x1.s3.g8.k4"},
                         Tiles{"tiled.128x32x32.w4x1.s3.g8", "tiled.64x128x32.w2x2.s3.g8.k3"}})
    check_forced(t.dx, t.dw,
                 {"1000x200x136 tf32 train", "300x72x40 tf32 eval", "2x24x16 tf32 train",
                  "777x330x521 tf32 train", "301x71x41 tf32 eval ldx=44 ldw=45",
                  "4097x127x129 tf32 train non_centred"},
                 "300x136x97 tf32 train", "1000x66x96 tf32 eval");
}

// Run twice directly and once from a captured CUDA graph: every gradient bit-identical (the
// reductions merge in a fixed order; nothing in run() may sync or allocate, or capture fails).
TEST_CASE("backward: bit-identical run to run, and under CUDA graph capture") {
  // The third: the heuristic splits its dW (N x K is a few tiles, the reduction 20000 rows).
  for (const char* line :
       {"1000x136x96 bf16 train", "300x72x40 fp16 eval", "20000x256x64 bf16 train",
        "1000x136x96 fp32 train" /* cuBLASLt's gradient GEMMs */}) {
    CAPTURE(std::string(line));
    StepCase k(line);
    const Stream& s = k.s;
    StepTensors& t = k.t;
    std::vector<DeviceBuffer*> outs{&t.saved, &t.dx,     &t.dw,   &t.dgamma,
                                    &t.dbias, &t.dscale, &t.dbeta};
    auto step = [&] {
      k.forward.run(s, t.fwd);
      k.backward.run(s, t.bwd);
    };
    auto snapshot = [&] { return k.snapshot(outs); };
    step();
    const auto first = snapshot();
    step();
    CHECK(snapshot() == first);
    CUgraph graph = nullptr;
    FJ_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    step();
    FJ_CU(cuStreamEndCapture(s, &graph));
    CUgraphExec exec = nullptr;
    FJ_CU(cuGraphInstantiate(&exec, graph, 0));
    FJ_CU(cuGraphLaunch(exec, s));
    CHECK(snapshot() == first);
    FJ_CU(cuGraphExecDestroy(exec));
    FJ_CU(cuGraphDestroy(graph));
    // The backward alone as a graph: its first kernel, a programmatic dependent launch, is a root
    // node with no kernel before it in the graph, launched after the forward ran on the stream.
    FJ_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    k.backward.run(s, t.bwd);
    FJ_CU(cuStreamEndCapture(s, &graph));
    FJ_CU(cuGraphInstantiate(&exec, graph, 0));
    k.forward.run(s, t.fwd);
    FJ_CU(cuGraphLaunch(exec, s));
    CHECK(snapshot() == first);
    FJ_CU(cuGraphExecDestroy(exec));
    FJ_CU(cuGraphDestroy(graph));
  }
}

// Train's three BatchNorm passes as one cooperative grid (fj_bwd_resident): the same arithmetic
// in the same order, so every gradient must equal the three passes' bit for bit. The three passes
// run when the cooperative launch is refused (the fault below), whose count says the run tried
// the resident grid; resident_grid_counts() says the first run was launched resident. Both run
// after a run on other dy, whose leftovers in the workspace would show. The built-in sweep's
// train cases run it against float64.
TEST_CASE("backward: train's passes in one resident grid equal the three passes bit for bit") {
  // 1000x1030x72: N's last vector is half a vector (rows padded to 1032), the last slab 40 rows.
  // 2048x8192x256: 2048 slabs x strips, more than the device holds at once: each block walks
  // several, the first held in shared memory (fj_bwd_resident_shared), as at 2100x4098x64, whose
  // last vector is half a vector and last slab 52 rows, at fp32 2048x4096x64 (8-byte rows) and
  // at bf16 2048x4097x64 (2-byte rows: a column a thread). 4100x1024x64: 72-row slabs, more than a
  // thread's registers hold: every slab is read twice, as by the three passes. 64x4096x64 and
  // 8x2048x64: more columns of 32 than blocks, so each block merges several columns' slabs
  // between the barriers.
  // Whether fj_bwd_resident_shared runs, on Hopper (four blocks of either kernel an SM): for the
  // layers of over 1,000 units, more than any such GPU holds at once (fp32's 8-byte rows and
  // bf16's 2-byte rows among them); 512 units fit 132 SMs' 528 blocks but not 114 SMs' 456.
  enum class Shared { no, yes, either };
  struct Layer {
    const char* line;
    Shared shared;
  };
  for (const Layer& layer :
       {Layer{"2048x2048x512 bf16 train", Shared::either},
        Layer{"1000x1030x72 fp16 train ldy=1032", Shared::no},
        Layer{"777x200x64 fp32 train", Shared::no},
        Layer{"8192x512x128 fp16 train", Shared::either},
        Layer{"2048x8192x256 bf16 train", Shared::yes},
        Layer{"2100x4098x64 fp16 train ldy=4104", Shared::yes},
        Layer{"2048x4096x64 fp32 train", Shared::yes},
        Layer{"2048x4097x64 bf16 train", Shared::yes}, Layer{"4100x1024x64 bf16 train", Shared::no},
        Layer{"64x4096x64 bf16 train", Shared::no}, Layer{"8x2048x64 fp16 train", Shared::no}}) {
    const char* line = layer.line;
    CAPTURE(std::string(line));
    StepCase k(line);
    StepTensors& t = k.t;
    std::vector<DeviceBuffer*> outs{&t.dx, &t.dw, &t.dgamma, &t.dbias, &t.dscale, &t.dbeta};
    for (DeviceBuffer* b : outs) b->fill_words(nan_word(k.c.problem.dtype));
    k.forward.run(k.s, t.fwd);
    // First a run on other dy, on the same workspace: its coefficients and strip counts are what
    // a block would read if the kernel's zeroing of the counts or its wait for them failed.
    const std::vector<unsigned char> dy = t.dy.download_bytes();
    HostTensor other(storage_type(k.c.problem.dtype), dy.size() / storage_bytes(k.c.problem.dtype));
    fill_normal(other, 2.0, 3.0);
    t.dy.upload(other.data(), other.bytes());
    k.backward.run(k.s, t.bwd);
    k.snapshot(outs);
    t.dy.upload(dy.data(), dy.size());
    const ResidentGridCounts before_run = resident_grid_counts();
    k.backward.run(k.s, t.bwd);
    // Else both runs took the three passes and the comparison below would prove nothing.
    const ResidentGridCounts after_run = resident_grid_counts();
    REQUIRE_MESSAGE(after_run.refused == before_run.refused,
                    "the driver refused fj_bwd_resident's cooperative launch on this device");
    CHECK(after_run.launched == before_run.launched + 1);
    if (Device::get(0).cc() == 90 && layer.shared != Shared::either)
      CHECK(after_run.shared == before_run.shared + (layer.shared == Shared::yes ? 1 : 0));
    const auto resident = k.snapshot(outs);
    const int before = fault::fired(Fault::cooperative_too_large);
    fault::arm(Fault::cooperative_too_large, 1);
    k.backward.run(k.s, t.bwd);
    const int fired = fault::fired(Fault::cooperative_too_large) - before;
    fault::arm(Fault::cooperative_too_large, 0);
    const auto passes = k.snapshot(outs);
    CHECK(fired == 1);
    CHECK(resident_grid_counts().refused == after_run.refused + 1);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      CAPTURE(i);
      std::size_t differ = 0;
      for (std::size_t b = 0; b < std::min(resident[i].size(), passes[i].size()); ++b)
        differ += resident[i][b] != passes[i][b];
      CHECK_MESSAGE(resident[i] == passes[i], differ, " of ", passes[i].size(), " bytes differ");
    }
    // Written at all: no element of dx or dW (the storage type's width) and no 4-byte word of a
    // parameter gradient still holds the poison.
    const std::uint32_t poison = nan_word(k.c.problem.dtype);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      CAPTURE(i);
      const std::vector<unsigned char>& b = resident[i];
      const std::size_t width = i < 2 ? storage_bytes(k.c.problem.dtype) : 4;
      std::size_t left = 0;
      for (std::size_t o = 0; o + width <= b.size(); o += width)
        left += std::memcmp(b.data() + o, &poison, width) == 0;
      CHECK(left == 0);
    }
  }
}

// fj_bwd_resident's grid is as large as the device holds at once, so two of them on two streams
// cannot both be resident: each must still complete (the driver places a cooperative grid whole)
// and count only its own blocks at its barriers. 20 rounds of two layers' backward passes, each on
// its own stream, must each give the bits the layer gives alone.
TEST_CASE("backward: resident grids on two streams at once each give their own dx") {
  const char* lines[] = {"2048x8192x256 bf16 train", "2048x8192x256 bf16 train non_centred"};
  StepCase a(lines[0]), b(lines[1]);
  a.forward.run(a.s, a.t.fwd);
  b.forward.run(b.s, b.t.fwd);
  a.backward.run(a.s, a.t.bwd);
  const auto alone_a = a.snapshot({&a.t.dx});
  b.backward.run(b.s, b.t.bwd);
  const auto alone_b = b.snapshot({&b.t.dx});
  REQUIRE(alone_a != alone_b);
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    a.backward.run(a.s, a.t.bwd);
    b.backward.run(b.s, b.t.bwd);
    CHECK(a.snapshot({&a.t.dx}) == alone_a);
    CHECK(b.snapshot({&b.t.dx}) == alone_b);
  }
}

// On sm_90+ every backward kernel is a programmatic dependent launch
// (common/grid_dependency.cuh). What the stream runs after run() must still see every output
// finished. The layer makes dX the slow GEMM: 4 tiles reducing over 8192 columns, against dW's
// 128 tiles reducing over 256 rows, so a dW that did not wait for dX would finish first and a
// copy queued after the run could catch dX half-written (poisoned with NaN before the run).
// Also: train's dbias is exactly 0 (y does not depend on the bias in train mode).
TEST_CASE("backward: the stream's next work sees every gradient finished; train's dbias is 0") {
  // dX is the slow GEMM: 4 tiles of 128x128, each reducing over N = 8192, while dW's 128 tiles
  // reduce over 256 rows. On Hopper dW runs beside dX (launch_backward) and its CTAs finish
  // theirs long before dX does: the run must still end only when dX has.
  const SweepCase c = parse_sweep_line("256x8192x256 bf16 train");
  const Problem& p = c.problem;
  const CaseInputs in = make_case_inputs(c);
  DeviceCase dev(in);
  const Stream s;
  const Plan forward(p);
  BackwardOptions o;
  if (Device::get(0).cc() == 90) {
    o.dx_config = KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1");
    o.dw_config = KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1");
  }
  const BackwardPlan backward(p, o);
  REQUIRE(p.param_dtype == DType::fp32);
  REQUIRE(p.has_bias);
  StepTensors t(p, dev);
  DeviceBuffer& dx = t.dx;
  DeviceBuffer& dbias = t.dbias;
  forward.run(s, t.fwd);
  s.synchronize();
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    dx.fill_words(nan_word(p.dtype));
    dbias.fill_words(0x7fc00000u);
    std::vector<unsigned char> after(dx.size(), 0);
    backward.run(s, t.bwd);
    // Stream-ordered: it starts when the stream says the run has finished.
    FJ_CU(cuMemcpyDtoHAsync(after.data(), reinterpret_cast<CUdeviceptr>(dx.get()), dx.size(), s));
    s.synchronize();
    CHECK(after == dx.download_bytes());
    // And dX was written at all (no NaN left from the poison).
    const std::vector<std::uint16_t> v = dx.download_as<std::uint16_t>(dx.size() / 2);
    std::size_t nan = 0;
    for (const std::uint16_t b : v) nan += (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0u;
    CHECK(nan == 0);
    const std::vector<float> db = dbias.download_as<float>(static_cast<std::size_t>(p.N));
    CHECK(std::count(db.begin(), db.end(), 0.f) == static_cast<std::ptrdiff_t>(db.size()));
  }
}

TEST_CASE("backward: bad input is named") {
  const SweepCase c = parse_sweep_line("256x64x64 bf16 train");
  const CaseInputs in = make_case_inputs(c);
  DeviceCase dev(in);
  const Tensors ft = dev.tensors();
  DeviceBuffer dy(256 * 64 * 2), saved(256 * 64 * 2), dx(256 * 64 * 2);
  const BackwardPlan plan(c.problem);
  BackwardTensors bt;
  bt.dy = dy.get();
  bt.saved = saved.get();
  bt.x = ft.x;
  bt.w = ft.w;
  bt.scale = ft.scale;
  bt.gamma = ft.gamma;
  bt.save_mean = ft.save_mean;
  bt.save_invstd = ft.save_invstd;
  bt.dx = dx.get();
  const Stream s;
  auto names = [&](const BackwardTensors& t, const char* arg) {
    CAPTURE(arg);
    try {
      plan.run(s, t);
      FAIL("no error");
    } catch (const InvalidArgument& e) {
      CHECK(e.argument() == arg);
    }
  };
  BackwardTensors t = bt;
  t.save_mean = nullptr;
  names(t, "save_mean");
  t = bt;
  t.dy = nullptr;
  names(t, "dy");
  t = bt;
  t.saved = nullptr;
  names(t, "saved");
  t = bt;
  t.w = nullptr;
  names(t, "w");
  t = bt;
  t.running_mean = ft.running_mean;
  names(t, "running_mean");
  t = bt;
  t.dbias = reinterpret_cast<void*>(static_cast<char*>(dx.get()) + 2);  // misaligned for fp32
  names(t, "dbias");
  t = bt;
  t.dx = const_cast<void*>(ft.w);  // the dX GEMM would overwrite W while it reads it
  names(t, "dx");
  try {
    DeviceBuffer small(256);
    plan.run(s, bt, 256, small.get(), 256);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "workspace");
  }
  try {
    plan.run(s, bt, 1);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "rows");
  }
}
