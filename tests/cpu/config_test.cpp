#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <set>

#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/plan_core.hpp"

using namespace fusejit;

namespace {

Problem problem(DType d, Mode m, std::int64_t M = 1024, std::int64_t N = 1024,
                std::int64_t K = 1024) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

}  // namespace

TEST_CASE("config keys round-trip and are distinct") {
  std::set<std::string> keys;
  for (const char* arch : {"sm_80", "sm_86", "sm_90a"}) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
      for (const auto& c : candidate_configs(problem(d, Mode::train), dev)) {
        const KernelConfig back = KernelConfig::parse(c.key());
        CHECK(back.key() == c.key());
        keys.insert(c.key());
      }
    }
  }
  CHECK(keys.size() >= 6);
  CHECK_THROWS_AS(KernelConfig::parse("tiled.128x128"), InvalidArgument);
  CHECK_THROWS_AS(KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8junk"), InvalidArgument);
  CHECK_THROWS_AS(KernelConfig::parse("gemm.1x1x1"), InvalidArgument);
  // Keys are exact: no spaces, signs or integers past int (sscanf's %d took all three, and
  // overflowing it is undefined behaviour).
  for (const char* bad :
       {"tiled. 128x128x32.w2x4.s4.g8", "tiled.+128x128x32.w2x4.s4.g8",
        "tiled.99999999999x128x32.w2x4.s4.g8", "warpspec.128x256x64.c2.s4.g8.cl1.p1.pp.pp",
        "warpspec.128x256x64.c2.s4.g8.cl1.p", "tiled.128x128x32.w2x4.s4.g8.pp",
        "tiled.128x128x32.w2x4.s4.g8.ts", "warpspec.128x256x64.c2.s4.g8.cl1.p1.ts.pp",
        "warpspec.128x256x64.c2.s4.g8.cl1.p1.ts.ts"})
    CHECK_THROWS_AS(KernelConfig::parse(bad), InvalidArgument);
  CHECK(KernelConfig::parse("warpspec.128x256x64.c2.s4.g8.cl1.p1.pp").pingpong);
  const KernelConfig ts = KernelConfig::parse("warpspec.128x256x64.c2.s4.g8.cl1.p1.ts");
  CHECK(ts.tma_store);
  CHECK(!ts.pingpong);
  CHECK(ts.key() == "warpspec.128x256x64.c2.s4.g8.cl1.p1.ts");
  CHECK(!KernelConfig::parse("warpspec.128x256x64.c2.s4.g8.cl1.p1").tma_store);
}

TEST_CASE(
    "tf32 on Hopper: 128x256 tiles with TMA stores in train and long eval; otherwise eval takes "
    "128x128 with 6 stages, in clusters of two where K is long") {
  const Device h100 = Device::for_arch("sm_90a");
  const std::int64_t shapes[][3] = {{1024, 8192, 8192}, {4096, 4096, 4096}, {65536, 256, 64}};
  for (const auto& s : shapes) {
    const std::int64_t M = s[0];
    CAPTURE(M);
    // The recompute twin, grid_sync as every warpspec twin without cluster or pingpong is: at
    // K = 64 the GEMM twice instead of y's round trip (65536 rows do not fit at once), and at
    // 1024 and 4096 rows one resident kernel in two and four rounds of column panels instead
    // of the round trip of 32 and 64 MB of fp32 y.
    CHECK(default_config(problem(DType::tf32, Mode::train, M, s[1], s[2]), h100).key() ==
          "warpspec.128x256x32.c2.s4.g16.cl1.p1.ts.rc.gs");
    CHECK(default_config(problem(DType::tf32, Mode::eval, M, s[1], s[2]), h100).key() ==
          (s[2] >= 2048 ? "warpspec.128x256x32.c2.s4.g16.cl1.p1.ts"
                        : "warpspec.128x128x32.c2.s6.g8.cl1.p1"));
    // Both cluster settings of 128x128 stay candidates for the tuner either way.
    bool cl1 = false, cl2 = false;
    for (const auto& c : candidate_configs(problem(DType::tf32, Mode::eval, M, s[1], s[2]), h100))
      if (c.variant == Variant::warpspec && c.bm == 128 && c.bn == 128 && c.stages == 6)
        (c.cluster_m == 2 ? cl2 : cl1) = true;
    CHECK(cl1);
    CHECK(cl2);
  }
  // Where TMA stores cannot run (N % 4 != 0: y's rows end inside a 16-byte unit) train falls
  // to the thread-store 128x256 (3 stages; its resident twin) and long eval to 128x128 in
  // clusters of two.
  Problem odd_n = problem(DType::tf32, Mode::train, 4096, 4094, 4096);
  odd_n.ldy = 4096;
  CHECK(default_config(odd_n, h100).key() == "warpspec.128x256x32.c2.s3.g16.cl1.p1.rc.gs");
  odd_n.mode = Mode::eval;
  CHECK(default_config(odd_n, h100).key() == "warpspec.128x128x32.c2.s6.g8.cl2.p1");
  // ...and its recompute twin stays a candidate where K is short (the first three configs of
  // the list get one; 128x256 s3 is first there).
  const KernelConfig short_k =
      default_config(problem(DType::tf32, Mode::train, 65536, 1022, 64), h100);
  CHECK(short_k.bn == 256);
  CHECK(short_k.stages == 3);
  CHECK(short_k.recompute);
  // A grid of under 256 wide tiles (ranked at M = 1024: 8 x 16) keeps 128x128 in pairs.
  CHECK(default_config(problem(DType::tf32, Mode::eval, 512, 4096, 4096), h100).key() ==
        "warpspec.128x128x32.c2.s6.g8.cl2.p1");
  // Clusters not first where unmeasured: few rows (a cluster over a lone row tile) or padded
  // rows.
  CHECK(default_config(problem(DType::tf32, Mode::eval, 128, 4096, 4096), h100).cluster_m == 1);
  CHECK(default_config(problem(DType::tf32, Mode::eval, 1024, 4096, 4095), h100).cluster_m == 1);
  // Short-K eval never offers the wide tile (measured slower on memory-bound shapes), not even
  // to the tuner.
  for (const auto& c : candidate_configs(problem(DType::tf32, Mode::eval, 2048, 2048, 512), h100))
    CHECK(!(c.variant == Variant::warpspec && c.bn == 256));
}

TEST_CASE("recompute: train's two-pass class only; the heuristic takes it where K is small") {
  const Device h100 = Device::for_arch("sm_90a");
  const Device a100 = Device::for_arch("sm_80");
  const KernelConfig rc = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.xm");
  CHECK(rc.recompute);
  CHECK(rc.exact_m);
  CHECK(rc.tma_store);
  CHECK(rc.key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.xm");
  CHECK(KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8.rc").recompute);
  CHECK(!KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8").recompute);
  CHECK_THROWS_AS(KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8.xm.rc"), InvalidArgument);

  const KernelConfig tiled_rc = KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8.rc");
  CHECK(tiled_rc.valid_for(problem(DType::bf16, Mode::train, 65, 256, 64), a100));
  CHECK(
      tiled_rc.why_invalid(problem(DType::bf16, Mode::train, 64, 256, 64), a100).find("one pass") !=
      std::string::npos);
  CHECK(tiled_rc.why_invalid(problem(DType::bf16, Mode::eval, 4096, 256, 64), a100)
            .find("train mode only") != std::string::npos);
  Problem ranks = problem(DType::bf16, Mode::train, 4096, 256, 64);
  ranks.stat_ranks = 2;
  CHECK(!tiled_rc.valid_for(ranks, a100));
  KernelConfig split = tiled_rc;
  split.split_k = 2;
  CHECK(
      split.why_invalid(problem(DType::bf16, Mode::train, 4096, 256, 1024), a100).find("split-K") !=
      std::string::npos);

  // H100, bf16 (measured, docs/performance.md): at K = 64 the second mainloop costs less than
  // y's round trip; at K = 512 and above it does not. 2048x2048x512 fits the GPU at once
  // (128 tiles of 128x256): its recompute twin runs as one kernel (grid_sync), no second pass.
  // So do 1024x8192x8192 and 2048x4096x4096, in two rounds of column panels (H200: 1.6-2% and
  // 3% faster than two-pass). In four rounds (4096x4096x4096) two-pass stays 1-2% faster in
  // bf16, and at 16384 rows a round of 128 row tiles re-reads x's 128 MB from DRAM, 16 times
  // (H200: 1.07 against 0.80-0.86 ms). 16384x1024x256 keeps plain recompute: four rounds of one
  // panel would cost more than its second mainloop.
  CHECK(default_config(problem(DType::bf16, Mode::train, 65536, 256, 64), h100).recompute);
  CHECK(default_config(problem(DType::bf16, Mode::train, 2048, 2048, 512), h100).grid_sync);
  for (const auto& s : {std::array<std::int64_t, 3>{2048, 4096, 4096},
                        std::array<std::int64_t, 3>{1024, 8192, 8192}}) {
    CAPTURE(s[0]);
    const KernelConfig c =
        default_config(problem(DType::bf16, Mode::train, s[0], s[1], s[2]), h100);
    CHECK(c.grid_sync);
    const unsigned grid = resident_grid(c, s[1], s[0], 132);
    CHECK((grid > 0 && grid < (s[0] / c.bm) * (s[1] / c.bn)));
  }
  for (const auto& s : {std::array<std::int64_t, 3>{4096, 4096, 4096},
                        std::array<std::int64_t, 3>{16384, 4096, 4096},
                        std::array<std::int64_t, 3>{8192, 12288, 3072}}) {
    CAPTURE(s[0]);
    CHECK(!default_config(problem(DType::bf16, Mode::train, s[0], s[1], s[2]), h100).recompute);
  }
  const KernelConfig narrow =
      default_config(problem(DType::bf16, Mode::train, 16384, 1024, 256), h100);
  CHECK((narrow.recompute && !narrow.grid_sync));
  // The tuner weighs the twins in train's two-pass class only.
  for (Mode m : {Mode::train, Mode::eval})
    for (std::int64_t M : {64, 4096}) {
      bool any = false;
      for (const auto& c : candidate_configs(problem(DType::bf16, m, M, 256, 64), h100))
        any = any || c.recompute;
      CHECK(any == (m == Mode::train && M > 128));
    }
}

TEST_CASE("grid_sync: recompute's warpspec twins without cluster or pingpong, key suffix .gs") {
  const Device h100 = Device::for_arch("sm_90a");
  const Problem train = problem(DType::bf16, Mode::train, 2048, 2048, 512);
  const KernelConfig gs = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs.xm");
  CHECK((gs.grid_sync && gs.recompute && gs.exact_m && gs.tma_store));
  CHECK(gs.key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs.xm");
  CHECK(gs.valid_for(train, h100));
  CHECK_THROWS_AS(KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.gs.rc"),
                  InvalidArgument);
  // Each rule refuses by name.
  auto refused = [&](const char* key, const char* why) {
    CAPTURE(key);
    const std::string got = KernelConfig::parse(key).why_invalid(train, h100);
    CHECK_MESSAGE(got.find(why) != std::string::npos, got);
  };
  refused("warpspec.128x256x64.c2.s4.g16.cl1.p1.gs", "only with recompute");
  refused("tiled.128x128x32.w2x4.s3.g8.rc.gs", "warpspec only");
  refused("warpspec.128x256x64.c2.s4.g16.cl2.p1.rc.gs", "cluster");
  refused("warpspec.128x128x64.c2.s5.g8.cl1.p1.pp.rc.gs", "pingpong");
  CHECK(!gs.valid_for(problem(DType::bf16, Mode::train, 128, 2048, 512), h100));  // one pass
  // The twins: every warpspec recompute candidate that can be grid_sync (all but the
  // statistics-from-x twin, which is never grid_sync) comes both ways, the grid_sync one first;
  // no other candidate is grid_sync.
  for (const Problem& p : {train, problem(DType::bf16, Mode::train, 65536, 256, 64),
                           problem(DType::tf32, Mode::train, 4096, 4096, 4096)}) {
    const std::vector<KernelConfig> list = candidate_configs(p, h100);
    for (const KernelConfig& c : list) {
      CAPTURE(c.key());
      const bool can = c.recompute && !c.input_stats && c.variant == Variant::warpspec &&
                       c.cluster_m == 1 && !c.pingpong;
      CHECK((!c.grid_sync || can));
      if (!can) continue;
      KernelConfig other = c;
      other.grid_sync = !c.grid_sync;
      CHECK(std::count_if(list.begin(), list.end(),
                          [&](const KernelConfig& x) { return x.key() == other.key(); }) == 1);
    }
  }
  // The time model: one kernel where every tile fits at once (1024x4096: 8 x 16 tiles of
  // 128x256 on 132 SMs) or every row tile of a column panel does (4096x4096: 32 x 16 tiles, four
  // rounds of 4 panels), a few microseconds more per round; recompute's cost where a panel's row
  // tiles do not fit (20000 rows: 157 row tiles).
  const KernelConfig rc = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc");
  const KernelConfig one = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs");
  const Problem fits = problem(DType::bf16, Mode::train, 1024, 4096, 4096);
  const Problem rounds = problem(DType::bf16, Mode::train, 4096, 4096, 4096);
  const Problem big = problem(DType::bf16, Mode::train, 20000, 4096, 4096);
  CHECK(estimated_us(fits, h100, one) < estimated_us(fits, h100, rc));
  CHECK(estimated_us(rounds, h100, one) < estimated_us(rounds, h100, rc));
  // What train adds over eval's GEMM grows with the rounds.
  auto train_cost = [&](const Problem& p) {
    Problem e = p;
    e.mode = Mode::eval;
    KernelConfig base = one;
    base.recompute = base.grid_sync = false;
    return estimated_us(p, h100, one) - estimated_us(e, h100, base);
  };
  CHECK(train_cost(rounds) > train_cost(fits));
  CHECK(estimated_us(big, h100, one) == estimated_us(big, h100, rc));
}

TEST_CASE(
    "TMA stores: warpspec, whole 16-byte units of y per row, not pingpong; the ring keeps 4 "
    "stages") {
  const Device h100 = Device::for_arch("sm_90a");
  const KernelConfig ts = KernelConfig::parse("warpspec.128x256x64.c2.s4.g8.cl1.p1.ts");
  for (DType d : {DType::bf16, DType::fp16})
    for (Mode m : {Mode::eval, Mode::train}) {
      CAPTURE(name(d));
      CAPTURE(name(m));
      // Per-warp boxes are small enough to sit beside the 4-stage 128x256 ring.
      CHECK(ts.why_invalid(problem(d, m), h100) == "");
      // A row end inside a 16-byte unit, with y's rows padded so that TMA loads still work.
      Problem tail = problem(d, m, 1024, 1020);
      tail.ldy = 1024;
      CHECK(ts.why_invalid(tail, h100).find("multiple of 8") != std::string::npos);
    }
  // fp32 y (tf32, tf32x3): boxes of 16 columns; rows of N % 4 != 0 end inside a unit. In eval
  // (with its coefficient buffers) the 128x256 tf32 tile fits 4 stages only with TMA stores'
  // small boxes.
  const KernelConfig ts32 = KernelConfig::parse("warpspec.128x256x32.c2.s4.g16.cl1.p1.ts");
  for (Mode m : {Mode::eval, Mode::train}) {
    CAPTURE(name(m));
    CHECK(ts32.why_invalid(problem(DType::tf32, m), h100) == "");
    Problem tail = problem(DType::tf32, m, 1024, 1022);
    tail.ldy = 1024;
    CHECK(ts32.why_invalid(tail, h100).find("multiple of 4") != std::string::npos);
  }
  KernelConfig threads = ts32;
  threads.tma_store = false;
  CHECK(threads.why_invalid(problem(DType::tf32, Mode::eval), h100).find("shared memory") !=
        std::string::npos);
  CHECK(KernelConfig::parse("warpspec.128x128x32.c2.s3.g8.cl1.p1.ts")
            .why_invalid(problem(DType::tf32x3, Mode::eval), h100) == "");
  KernelConfig pp_ts = KernelConfig::parse("warpspec.128x128x64.c2.s5.g8.cl1.p1.pp");
  pp_ts.tma_store = true;
  CHECK(pp_ts.why_invalid(problem(DType::bf16, Mode::eval), h100).find("pingpong") !=
        std::string::npos);
  KernelConfig tiled_ts = KernelConfig::parse("tiled.128x128x64.w2x2.s3.g8");
  tiled_ts.tma_store = true;
  CHECK(!tiled_ts.valid_for(problem(DType::bf16, Mode::eval), Device::for_arch("sm_80")));
  // TMA stores are the default where they are valid; elsewhere the thread-store twin is.
  CHECK(default_config(problem(DType::bf16, Mode::train, 4096, 4096, 4096), h100).key() ==
        "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts");
  Problem padded = problem(DType::fp16, Mode::eval, 4096, 4092, 4096);
  padded.ldy = 4096;
  CHECK(default_config(padded, h100).key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1");
  // The candidates offer a TMA-store twin only where it is valid.
  auto has_ts = [&](const Problem& p) {
    for (const auto& c : candidate_configs(p, h100))
      if (c.tma_store) return true;
    return false;
  };
  CHECK(has_ts(problem(DType::bf16, Mode::eval)));
  Problem tail = problem(DType::bf16, Mode::eval, 1024, 1020);
  tail.ldy = 1024;
  CHECK(!has_ts(tail));
  CHECK(!has_ts(problem(DType::tf32, Mode::eval)));  // K = 1024: no 128x256 tile in eval
  CHECK(has_ts(problem(DType::tf32, Mode::train)));
}

TEST_CASE("every candidate is valid for its device, and pruning says why") {
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_120"}) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
      const auto cs = candidate_configs(problem(d, Mode::eval), dev);
      REQUIRE(!cs.empty());
      for (const auto& c : cs) CHECK(c.valid_for(problem(d, Mode::eval), dev));
    }
  }
  // wgmma exists only on sm_90a; strict fp32 has no wgmma path; TMA needs 16-byte rows.
  KernelConfig ws = KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p0");
  CHECK(!ws.valid_for(problem(DType::bf16, Mode::eval), Device::for_arch("sm_80")));
  CHECK(!ws.valid_for(problem(DType::fp32, Mode::eval), Device::for_arch("sm_90a")));
  Problem unaligned = problem(DType::bf16, Mode::eval, 64, 64, 5);
  unaligned.alignment = 2;
  CHECK(ws.why_invalid(unaligned, Device::for_arch("sm_90a")).find("16-byte") != std::string::npos);
  // A config whose shared memory exceeds the device's limit is pruned.
  KernelConfig huge = KernelConfig::parse("tiled.128x256x64.w2x4.s3.g8");
  CHECK(huge.why_invalid(problem(DType::bf16, Mode::eval), Device::for_arch("sm_86"))
            .find("shared memory") != std::string::npos);
  CHECK_THROWS_AS(default_config(problem(DType::bf16, Mode::eval), Device::for_arch("sm_80"),
                                 Variant::warpspec),
                  InvalidArgument);
}

TEST_CASE("architectures parse and older than sm_80 are refused") {
  CHECK(parse_arch("sm_90a").cc == 90);
  CHECK(parse_arch("sm_90a").arch_specific);
  CHECK(parse_arch("8.6").cc == 86);
  CHECK(parse_arch("compute_120").cc == 120);
  CHECK(Device::for_arch("sm_90").arch() == "sm_90a");
  CHECK(Device::for_arch("sm_89").arch() == "sm_89");
  CHECK_THROWS_AS(parse_arch("sm_75"), InvalidArgument);
  CHECK_THROWS_AS(parse_arch("hopper"), InvalidArgument);
}

TEST_CASE("pruning mirrors the mainloops' static limits") {
  const Device dev = Device::for_arch("sm_90a");
  Problem p = problem(DType::bf16, Mode::eval);
  // 64x128 warp tile: 256 accumulators per thread.
  CHECK(KernelConfig::parse("tiled.128x256x64.w2x2.s3.g8")
            .why_invalid(p, dev)
            .find("128 accumulators") != std::string::npos);
  // 24 bf16 = 48 bytes per k-row: not a power of two.
  CHECK(
      KernelConfig::parse("tiled.128x128x24.w2x2.s3.g8").why_invalid(p, dev).find("power of two") !=
      std::string::npos);
  p.dtype = DType::fp32;
  CHECK(KernelConfig::parse("tiled.128x128x16.w4x4.s3.g8").why_invalid(p, dev).find("2048") !=
        std::string::npos);
  CHECK(KernelConfig::parse("tiled.128x128x16.w4x2.s3.g8").valid_for(p, dev));
}

TEST_CASE("split-K keys: '.k<S>' after the tiled key or warpspec's '.p<0|1>', nothing for S = 1") {
  const KernelConfig c = KernelConfig::parse("tiled.64x64x32.w2x1.s3.g8.k8");
  CHECK(c.variant == Variant::tiled);
  CHECK(c.split_k == 8);
  CHECK(c.bm == 64);
  CHECK(c.group_m == 8);
  CHECK(c.key() == "tiled.64x64x32.w2x1.s3.g8.k8");
  // Keys from before split-K mean S = 1 and print as they always did.
  const KernelConfig one = KernelConfig::parse("tiled.128x128x32.w2x4.s3.g8");
  CHECK(one.split_k == 1);
  CHECK(one.key() == "tiled.128x128x32.w2x4.s3.g8");
  KernelConfig s = one;
  s.split_k = 3;
  CHECK(s.key() == "tiled.128x128x32.w2x4.s3.g8.k3");
  CHECK(KernelConfig::parse(s.key()).split_k == 3);
  for (const char* bad :
       {"tiled.64x64x32.w2x1.s3.g8.k", "tiled.64x64x32.w2x1.s3.g8.k8junk",
        "tiled.64x64x32.w2x1.s3.g8.k8.k2", "tiled.64x64x32.w2x1.s3.g8k8",
        "warpspec.128x128x64.c2.s4.g8.cl1.p1.ts.k2", "warpspec.128x128x64.c2.s4.g8.cl1.p1.k2.k2"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(KernelConfig::parse(bad), InvalidArgument);
  }
  // Warpspec splits for the gradient GEMMs (plan/backward_core.hpp), not the forward.
  const KernelConfig w = KernelConfig::parse("warpspec.64x64x64.c1.s8.g8.cl1.p1.k32");
  CHECK(w.variant == Variant::warpspec);
  CHECK(w.split_k == 32);
  CHECK(w.persistent);
  CHECK(w.key() == "warpspec.64x64x64.c1.s8.g8.cl1.p1.k32");
  CHECK(KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p0.k2.pp").pingpong);
  CHECK(KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p0.k2.pp").split_k == 2);
  CHECK(KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p1").split_k == 1);
  const Problem fwd = problem(DType::bf16, Mode::eval, 128, 512, 1024);
  CHECK(w.why_invalid(fwd, Device::for_arch("sm_90a")).find("split_k") != std::string::npos);
}

TEST_CASE("split-K pruning: tiled only, 1..32 splits, never more splits than k tiles") {
  const Device dev = Device::for_arch("sm_90a");
  const Problem p = problem(DType::fp32, Mode::train, 128, 512, 1024);
  auto why = [&](const char* key, const Problem& q) {
    return KernelConfig::parse(key).why_invalid(q, dev);
  };
  CHECK(why("tiled.64x64x16.w2x1.s3.g8.k16", p).empty());
  CHECK(why("tiled.128x128x32.w4x2.s3.g8.k32", p).empty());  // 32 k tiles, one each
  CHECK(why("tiled.64x64x16.w2x1.s3.g8.k0", p).find("1..32") != std::string::npos);
  KernelConfig negative = KernelConfig::parse("tiled.64x64x16.w2x1.s3.g8");
  negative.split_k = -2;  // keys carry no signs (parse refuses them), callers' structs may
  CHECK(negative.why_invalid(p, dev).find("1..32") != std::string::npos);
  CHECK_THROWS_AS(KernelConfig::parse("tiled.64x64x16.w2x1.s3.g8.k-2"), InvalidArgument);
  CHECK(why("tiled.64x64x16.w2x1.s3.g8.k33", p).find("1..32") != std::string::npos);
  CHECK(why("tiled.64x64x16.w2x1.s3.g8.k600", p).find("-512..512") != std::string::npos);
  // K = 1000 at BK = 32 is 32 k tiles (the last one partial); K = 40 is 2.
  CHECK(why("tiled.128x128x32.w4x2.s3.g8.k32", problem(DType::fp32, Mode::eval, 128, 512, 1000))
            .empty());
  CHECK(why("tiled.128x128x32.w4x2.s3.g8.k3", problem(DType::fp32, Mode::eval, 128, 512, 40))
            .find("exceeds the 2 k tiles") != std::string::npos);
  KernelConfig ws = KernelConfig::parse("warpspec.128x128x64.c2.s4.g8.cl1.p1");
  ws.split_k = 2;
  CHECK(ws.why_invalid(problem(DType::bf16, Mode::eval), dev).find("tiled") != std::string::npos);
  // The reduce kernel's shared memory is pruned like the GEMM's.
  CHECK(KernelConfig::parse("tiled.64x64x16.w2x1.s3.g8").splitk_reduce_smem_bytes() == 0);
  CHECK(KernelConfig::parse("tiled.64x64x16.w2x1.s3.g8.k4").splitk_reduce_smem_bytes() > 0);
}

TEST_CASE("split-K candidates come only for small tile grids with a long K") {
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    const Device dev = Device::for_arch(arch);
    for (DType d : {DType::fp32, DType::bf16})
      for (Mode m : {Mode::train, Mode::eval}) {
        CAPTURE(arch);
        CAPTURE(name(d));
        CAPTURE(name(m));
        // The large shapes keep their picks: no split-K candidate at all, so the heuristic's
        // choice is what it was before split-K existed.
        for (const Problem& big :
             {problem(d, m, 1024, 8192, 8192), problem(d, m, 16384, 4096, 4096)}) {
          CHECK(default_config(big, dev).split_k == 1);
          for (const auto& c : candidate_configs(big, dev)) CHECK(c.split_k == 1);
        }
        // 128x512x1024: 4 output tiles of 128x128 on 108-132 SMs. Split-K candidates are offered,
        // each valid; strict fp32 (no tensor cores to shorten the K loop) picks one.
        const Problem small = problem(d, m, 128, 512, 1024);
        int split = 0;
        for (const auto& c : candidate_configs(small, dev)) {
          split += c.split_k > 1;
          CHECK(c.valid_for(small, dev));
        }
        CHECK(split >= 4);
        const KernelConfig pick = default_config(small, dev);
        MESSAGE(arch << " " << name(d) << " " << name(m) << " 128x512x1024 -> " << pick.key());
        if (d == DType::fp32) CHECK(pick.split_k > 1);
        // Short K: nothing to split.
        for (const auto& c : candidate_configs(problem(d, m, 128, 512, 64), dev))
          CHECK(c.split_k == 1);
        // Tensor-core split grids stay within one CTA per SM (a second one measured slower),
        // SIMT ones within two.
        const Problem mid = problem(d, m, 1024, 1024, 1024);
        for (const auto& c : candidate_configs(mid, dev)) {
          const std::int64_t ctas =
              (1024 + c.bm - 1) / c.bm * ((1024 + c.bn - 1) / c.bn) * c.split_k;
          if (c.split_k > 1) CHECK(ctas <= (d == DType::fp32 ? 2 : 1) * dev.sm_count);
        }
      }
  }
}

TEST_CASE("a key with control characters is refused with them escaped") {
  for (const char* bad : {"tiled.\x1b[2J128x128x32.w2x4.s3.g8", "tiled.128x128x32.w2x4.s3.g8\n",
                          "warpspec.128x256x64.c2.s4.g8.cl1.p1\r.pp"}) {
    try {
      KernelConfig::parse(bad);
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      CHECK(e.argument() == "config");
      for (const char c : what) CHECK((c >= 0x20 && c < 0x7f));
      CHECK((what.find("\\x1b") != std::string::npos || what.find("\\x0a") != std::string::npos ||
             what.find("\\x0d") != std::string::npos));
    }
  }
  try {
    parse_variant("tiled\x07");
    FAIL("accepted");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("'tiled\\x07'") != std::string::npos);
  }
}

TEST_CASE("pad_operands: warpspec on rows TMA cannot load, after a copy into aligned rows") {
  const Device h100 = Device::for_arch("sm_90a");
  const Device a100 = Device::for_arch("sm_80");
  const KernelConfig pad = KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1.pad");
  CHECK(pad.pad_operands);
  CHECK(pad.key() == "warpspec.128x128x64.c2.s6.g8.cl1.p1.pad");
  const KernelConfig all = KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1.pad.rc.xm");
  CHECK((all.pad_operands && all.recompute && all.exact_m));
  CHECK(all.key() == "warpspec.128x128x64.c2.s6.g8.cl1.p1.pad.rc.xm");
  CHECK_THROWS_AS(KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1.rc.pad"),
                  InvalidArgument);
  CHECK_THROWS_AS(KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1.pad.pad"),
                  InvalidArgument);

  // Valid exactly where the rows are not 16-byte aligned: odd K (16-bit), K % 4 (tf32), an odd
  // stride, a promised alignment below 16.
  CHECK(pad.valid_for(problem(DType::bf16, Mode::train, 777, 1536, 2050), h100));
  CHECK(pad.why_invalid(problem(DType::bf16, Mode::train, 777, 1536, 2048), h100)
            .find("aligned already") != std::string::npos);
  Problem odd_ldy = problem(DType::fp16, Mode::eval, 1000, 64, 64);
  odd_ldy.ldy = 65;
  CHECK(pad.valid_for(odd_ldy, h100));
  Problem promised = problem(DType::bf16, Mode::eval, 1000, 64, 64);
  promised.alignment = 4;
  CHECK(pad.valid_for(promised, h100));
  CHECK(KernelConfig::parse("warpspec.128x128x32.c2.s6.g8.cl1.p1.pad")
            .valid_for(problem(DType::tf32, Mode::eval, 300, 72, 131), h100));
  // Not on tiled (it loads any alignment), not before Hopper, not with TMA stores (y is as
  // unaligned as x), not in strict fp32; recompute's own rules still hold.
  CHECK(!KernelConfig::parse("tiled.128x128x64.w2x2.s3.g8.pad")
             .valid_for(problem(DType::bf16, Mode::eval, 777, 1536, 2050), h100));
  CHECK(!pad.valid_for(problem(DType::bf16, Mode::eval, 777, 1536, 2050), a100));
  CHECK(!KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1.ts.pad")
             .valid_for(problem(DType::bf16, Mode::eval, 777, 1536, 2050), h100));
  const KernelConfig pad_rc = KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1.pad.rc");
  CHECK(!pad_rc.valid_for(problem(DType::fp16, Mode::eval, 300, 200, 67), h100));
  CHECK(!pad_rc.valid_for(problem(DType::fp16, Mode::train, 2, 7, 5), h100));
  CHECK(pad_rc.valid_for(problem(DType::fp16, Mode::train, 300, 200, 67), h100));

  // The heuristic on H100 takes the padded warpspec path for unaligned rows (measured: 777x1536x
  // 2050 bf16 train 0.036 ms padded vs 0.101 tiled, docs/performance.md), and the candidates
  // hold no unpadded warpspec config there.
  for (Mode m : {Mode::train, Mode::eval}) {
    const Problem p = problem(DType::bf16, m, 777, 1536, 2050);
    CHECK(default_config(p, h100).pad_operands);
    for (const auto& c : candidate_configs(p, h100))
      CHECK((c.variant == Variant::tiled) != c.pad_operands);
  }
  // The workspace holds W's copy, then x's (the GEMM's two tensor maps), after train's regions.
  const Problem unaligned = problem(DType::bf16, Mode::train, 777, 1536, 2050);
  const WorkspaceLayout w = workspace_layout(unaligned, pad);
  CHECK(w.padded_offset >= w.coef_offset + w.coef_bytes);
  CHECK(w.padded_offset % kWorkspaceAlign == 0);
  CHECK(w.padded_bytes == std::size_t{1536 + 777} * 2112 * 2);
  CHECK(w.padded_x_offset == w.padded_offset + std::size_t{1536} * 2112 * 2);
  CHECK(w.padded_x_offset % 128 == 0);
  CHECK(w.total >= w.padded_offset + w.padded_bytes);
  KernelConfig plain = pad;
  plain.pad_operands = false;
  CHECK(workspace_layout(unaligned, plain).padded_bytes == 0);
  CHECK(padded_row_elements(problem(DType::bf16, Mode::eval, 1, 1, 2050)) == 2112);
  CHECK(padded_row_elements(problem(DType::tf32, Mode::eval, 1, 1, 131)) == 160);
  CHECK(padded_row_elements(problem(DType::fp16, Mode::eval, 1, 1, 64)) == 64);
}

TEST_CASE(
    "overlap_apply: persistent warpspec two-pass train only, key suffix .oa, not a candidate") {
  const Device h100 = Device::for_arch("sm_90a");
  const Problem train = problem(DType::bf16, Mode::train, 4096, 4096, 4096);
  const KernelConfig oa = KernelConfig::parse("warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa.xm");
  CHECK((oa.overlap_apply && oa.exact_m && oa.tma_store && !oa.recompute));
  CHECK(oa.key() == "warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa.xm");
  CHECK(oa.valid_for(train, h100));
  CHECK_THROWS_AS(KernelConfig::parse("warpspec.128x256x64.c2.s4.g4.cl1.p1.oa.gs"),
                  InvalidArgument);
  auto refused = [&](const Problem& p, const char* key, const char* why) {
    CAPTURE(key);
    const std::string got = KernelConfig::parse(key).why_invalid(p, h100);
    CHECK_MESSAGE(got.find(why) != std::string::npos, got);
  };
  refused(train, "warpspec.128x256x64.c2.s4.g4.cl1.p0.oa", "persistent");
  refused(train, "tiled.128x128x32.w2x4.s3.g8.oa", "warpspec");
  refused(train, "warpspec.128x256x64.c2.s4.g4.cl2.p1.oa", "cluster");
  refused(train, "warpspec.128x128x64.c2.s5.g8.cl1.p1.pp.oa", "pingpong");
  refused(train, "warpspec.128x256x64.c2.s4.g4.cl1.p1.rc.oa", "recompute");
  refused(problem(DType::bf16, Mode::eval, 4096, 4096, 4096),
          "warpspec.128x256x64.c2.s4.g4.cl1.p1.oa", "train mode");
  refused(problem(DType::bf16, Mode::train, 128, 4096, 4096),
          "warpspec.128x256x64.c2.s4.g4.cl1.p1.oa", "more rows than one tile");
  refused(problem(DType::tf32x3, Mode::train, 4096, 4096, 4096),
          "warpspec.128x128x32.c2.s3.g4.cl1.p1.oa", "tf32x3");
  // The apply warps' 6 KiB of row slots fit beside four 48 KiB stages of 128x256 tiles with the
  // TMA stores' boxes (exactly: 232448 bytes), not with the thread stores' larger staging.
  CHECK(KernelConfig::parse("warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa").smem_bytes(train) ==
        232448);
  CHECK(KernelConfig::parse("warpspec.128x256x32.c2.s4.g1.cl1.p1.ts.oa")
            .valid_for(problem(DType::tf32, Mode::train, 4096, 4096, 4096), h100));
  refused(train, "warpspec.128x256x64.c2.s4.g4.cl1.p1.oa", "above 227 KiB");
  // Measured slower than the two-pass schedule on H100 (docs/performance.md): not a candidate.
  for (const Problem& p : {train, problem(DType::bf16, Mode::train, 16384, 4096, 4096)})
    for (const KernelConfig& c : candidate_configs(p, h100)) CHECK(!c.overlap_apply);
}

TEST_CASE("input_stats: recompute with K <= 64 only, key suffix .cv after .rc, tuner candidates") {
  const Device h100 = Device::for_arch("sm_90a");
  const Problem train = problem(DType::bf16, Mode::train, 65536, 256, 64);
  const KernelConfig cv = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv.xm");
  CHECK((cv.input_stats && cv.recompute && cv.exact_m && !cv.grid_sync));
  CHECK(cv.key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv.xm");
  CHECK(cv.valid_for(train, h100));
  CHECK(KernelConfig::parse("tiled.128x128x32.w2x4.s3.g8.rc.cv")
            .valid_for(problem(DType::fp32, Mode::train, 1000, 130, 1), Device::for_arch("sm_80")));
  // .cv goes between .rc and .gs: a key in another order is not a key.
  CHECK_THROWS_AS(KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.cv.rc"),
                  InvalidArgument);
  auto refused = [&](const Problem& p, const char* key, const char* why) {
    CAPTURE(key);
    const std::string got = KernelConfig::parse(key).why_invalid(p, h100);
    CHECK_MESSAGE(got.find(why) != std::string::npos, got);
  };
  refused(train, "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.cv", "only with recompute");
  refused(train, "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv.gs", "not with grid_sync");
  refused(problem(DType::bf16, Mode::train, 65536, 256, 72),
          "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv", "K = 72 above 64");
  // Twins of the first three warpspec configs and the first tiled one (K <= 64, train), for
  // the tuner only: the heuristic never picks them (measured 4-5% faster than recompute at
  // 65536x256x64 and 16384x1024x64 bf16 but 20% slower at 8192x512x64, docs/performance.md);
  // neither K above 64, eval, strict fp32 nor 3xTF32 gets one.
  for (const Problem& p : {train, problem(DType::bf16, Mode::train, 16384, 1024, 64),
                           problem(DType::bf16, Mode::train, 8192, 512, 64),
                           problem(DType::tf32, Mode::train, 65536, 256, 64)}) {
    CAPTURE(p.M);
    CAPTURE(p.N);
    const std::vector<KernelConfig> list = candidate_configs(p, h100);
    std::vector<KernelConfig> twins;
    for (const KernelConfig& c : list)
      if (c.input_stats) twins.push_back(c);
    // Three warpspec twins where three warpspec configs run the layer (all four here).
    CHECK(std::count_if(twins.begin(), twins.end(),
                        [](const KernelConfig& c) { return c.variant == Variant::warpspec; }) == 3);
    CHECK(std::count_if(twins.begin(), twins.end(),
                        [](const KernelConfig& c) { return c.variant == Variant::tiled; }) == 1);
    // Each twin is a plain candidate's, with recompute's and the statistics' suffixes.
    for (const KernelConfig& c : twins) {
      KernelConfig plain = c;
      plain.recompute = plain.input_stats = false;
      CHECK(std::any_of(list.begin(), list.end(),
                        [&](const KernelConfig& o) { return o.key() == plain.key(); }));
    }
    CHECK(!default_config(p, h100).input_stats);
  }
  for (const Problem& p : {problem(DType::bf16, Mode::train, 65536, 256, 72),
                           problem(DType::bf16, Mode::eval, 65536, 256, 64),
                           problem(DType::fp32, Mode::train, 65536, 256, 64),
                           problem(DType::tf32x3, Mode::train, 65536, 256, 64)})
    for (const KernelConfig& c : candidate_configs(p, h100)) CHECK(!c.input_stats);
}
