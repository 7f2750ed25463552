#include <doctest/doctest.h>

#include <algorithm>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"

using namespace fusejit;

namespace {

Problem problem() {
  Problem p;
  p.M = 1000, p.N = 200, p.K = 64;
  return p;
}

KernelConfig config() {
  return KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8");
}

}  // namespace

TEST_CASE("codegen is deterministic and specializes the prelude, not the templates") {
  const KernelSource a = generate(problem(), config());
  const KernelSource b = generate(problem(), config());
  CHECK(a.text == b.text);
  CHECK(a.name == b.name);
  CHECK(a.options == b.options);
  // M is the run's (0 in the Spec) unless the config asks for exact M.
  CHECK(a.text.find("static constexpr int M = 0, N = 200, K = 64;") != std::string::npos);
  KernelConfig exact = config();
  exact.exact_m = true;
  CHECK(generate(problem(), exact).text.find("static constexpr int M = 1000, N = 200, K = 64;") !=
        std::string::npos);
  CHECK(a.text.find("using T = fj::bf16_t;") != std::string::npos);
  CHECK(a.text.find("#include \"kernels/tiled_gemm.cuh\"") != std::string::npos);
  // The templates travel as headers, byte for byte as embedded.
  CHECK(!a.headers.empty());
  bool has_epilogue = false;
  for (const auto& [name, text] : a.headers) has_epilogue |= name == "epilogue/bn_epilogue.cuh";
  CHECK(has_epilogue);
}

TEST_CASE("the kernel schedule follows the mode and whether M fits one tile") {
  Problem p = problem();
  // 8 row tiles: fj_apply merges the partials itself.
  CHECK(schedule(p, config()).fold_finalize);
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm", "fj_apply_fold"});
  p.momentum = std::nullopt;
  CHECK(schedule(p, config()).kernels ==
        std::vector<std::string>{"fj_gemm", "fj_apply_fold", "fj_bump"});
  // 9 row tiles: a finalize kernel merges them once per column.
  p.M = 8 * 128 + 1;
  CHECK(!schedule(p, config()).fold_finalize);
  CHECK(schedule(p, config()).kernels ==
        std::vector<std::string>{"fj_gemm", "fj_finalize", "fj_apply"});
  p.momentum = 0.1;
  CHECK(schedule(p, config()).kernels ==
        std::vector<std::string>{"fj_gemm", "fj_finalize", "fj_apply"});
  p.M = 128;
  CHECK(schedule(p, config()).single_pass);
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm"});
  p.momentum = std::nullopt;
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm", "fj_bump"});
  p.mode = Mode::eval;
  CHECK(schedule(p, config()).kernels == std::vector<std::string>{"fj_gemm"});
  const KernelSource src = generate(p, config());
  CHECK(src.kernels == std::vector<std::string>{"fj_gemm"});
}

TEST_CASE("the cache key changes when any one input changes, and only then") {
  const KernelSource src = generate(problem(), config());
  const std::string k = cache_key(src, "sm_90a", "13.0");
  CHECK(k.size() == 32);
  CHECK(cache_key(src, "sm_90a", "13.0") == k);
  CHECK(cache_key(generate(problem(), config()), "sm_90a", "13.0") == k);
  KernelSource s2 = src;
  s2.text += " ";
  CHECK(cache_key(s2, "sm_90a", "13.0") != k);
  KernelSource s3 = src;
  s3.options.push_back("-lineinfo");
  CHECK(cache_key(s3, "sm_90a", "13.0") != k);
  KernelSource s4 = src;
  s4.headers.back().second += "\n";
  CHECK(cache_key(s4, "sm_90a", "13.0") != k);
  CHECK(cache_key(src, "sm_80", "13.0") != k);
  CHECK(cache_key(src, "sm_90a", "13.1") != k);
  // The name is a label, not an input of the binary.
  KernelSource s5 = src;
  s5.name = "renamed";
  CHECK(cache_key(s5, "sm_90a", "13.0") == k);
}

TEST_CASE("split-K: the reduce kernel follows the GEMM, then the unsplit schedule's passes") {
  const KernelConfig split = KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8.k8");
  using Names = std::vector<std::string>;
  Problem p = problem();  // 1000 rows: 8 row tiles, fj_apply merges the partials
  p.K = 1000;             // 32 k tiles: 8 splits of 4
  CHECK(schedule(p, split).split_k);
  CHECK(!schedule(p, config()).split_k);
  CHECK(schedule(p, split).kernels == Names{"fj_gemm", "fj_splitk_reduce", "fj_apply_fold"});
  p.M = 8 * 128 + 1;
  CHECK(schedule(p, split).kernels ==
        Names{"fj_gemm", "fj_splitk_reduce", "fj_finalize", "fj_apply"});
  p.M = 128;
  CHECK(schedule(p, split).single_pass);
  CHECK(schedule(p, split).kernels == Names{"fj_gemm", "fj_splitk_reduce"});
  p.momentum = std::nullopt;
  CHECK(schedule(p, split).kernels == Names{"fj_gemm", "fj_splitk_reduce", "fj_bump"});
  p.mode = Mode::eval;
  CHECK(schedule(p, split).kernels == Names{"fj_gemm", "fj_splitk_reduce"});
  // The source defines exactly the scheduled kernels and exports the reduce's launch shape and
  // shared memory; the Spec says how many splits.
  p.mode = Mode::train;
  const KernelSource src = generate(p, split);
  CHECK(src.kernels == schedule(p, split).kernels);
  for (const char* needle :
       {"WARPS_M = 2, WARPS_N = 4, SPLIT_K = 8;", "#include \"kernels/splitk_reduce.cuh\"",
        "#include \"kernels/bn_apply.cuh\"", "fj_splitk_reduce_smem_bytes",
        "fj_splitk_reduce_launch[3]", "fj_splitk_reduce(const fj::Params p)",
        "fj_bump(const fj::Params p)"}) {
    CAPTURE(needle);
    CHECK(src.text.find(needle) != std::string::npos);
  }
  // Eval: no BatchNorm pass after the reduce, so no apply header.
  p.mode = Mode::eval;
  CHECK(generate(p, split).text.find("bn_apply.cuh") == std::string::npos);
  // Unsplit: SPLIT_K = 1 and nothing of the reduce.
  const KernelSource plain = generate(p, config());
  CHECK(plain.text.find("SPLIT_K = 1;") != std::string::npos);
  CHECK(plain.text.find("splitk") == std::string::npos);
  CHECK(plain.kernels == Names{"fj_gemm"});
}

TEST_CASE("the cache key follows split-K's S") {
  Problem p = problem();
  p.K = 1000;
  const std::string one = cache_key(generate(p, config()), "sm_80", "13.0");
  KernelConfig c = config();
  c.split_k = 2;
  const std::string two = cache_key(generate(p, c), "sm_80", "13.0");
  c.split_k = 4;
  const std::string four = cache_key(generate(p, c), "sm_80", "13.0");
  CHECK(one != two);
  CHECK(two != four);
  CHECK(one != four);
}

TEST_CASE("dynamic M: problems that differ only in M give one source and one cache key per class") {
  Problem a = problem();
  for (const Mode mode : {Mode::train, Mode::eval}) {
    a.mode = mode;
    Problem b = a;
    b.M = 9 * 128 + 77;  // another row-tile count, and unfolded rather than folded apply
    const KernelSource sa = generate(a, config()), sb = generate(b, config());
    CHECK(sa.text == sb.text);
    CHECK(sa.name == sb.name);
    CHECK(cache_key(sa, "sm_90a", "13.0") == cache_key(sb, "sm_90a", "13.0"));
    CHECK(sa.text.find(std::to_string(a.M)) == std::string::npos);
    // exact_m puts M back, and with it a key per M.
    KernelConfig exact = config();
    exact.exact_m = true;
    CHECK(cache_key(generate(a, exact), "sm_90a", "13.0") !=
          cache_key(generate(b, exact), "sm_90a", "13.0"));
    CHECK(cache_key(generate(a, exact), "sm_90a", "13.0") != cache_key(sa, "sm_90a", "13.0"));
  }
  // Train: M <= BM is the single-pass class, with its own source.
  Problem small = problem();
  small.M = 128;
  Problem tiny = small;
  tiny.M = 2;
  CHECK(generate(small, config()).text == generate(tiny, config()).text);
  CHECK(generate(small, config()).text != generate(problem(), config()).text);
  // Eval has one class: M = 2 and M = 1000 share a source.
  small.mode = tiny.mode = Mode::eval;
  Problem big = problem();
  big.mode = Mode::eval;
  CHECK(generate(tiny, config()).text == generate(big, config()).text);
}

TEST_CASE("a two-pass kernel set holds both apply paths; each run picks one by its row tiles") {
  using Names = std::vector<std::string>;
  Problem p = problem();
  CHECK(kernel_set(p, config()) == Names{"fj_gemm", "fj_finalize", "fj_apply", "fj_apply_fold"});
  p.momentum = std::nullopt;
  CHECK(kernel_set(p, config()) ==
        Names{"fj_gemm", "fj_finalize", "fj_apply", "fj_apply_fold", "fj_bump"});
  CHECK(schedule(p, config(), 129).kernels == Names{"fj_gemm", "fj_apply_fold", "fj_bump"});
  CHECK(schedule(p, config(), 8 * 128).kernels == Names{"fj_gemm", "fj_apply_fold", "fj_bump"});
  CHECK(schedule(p, config(), 8 * 128 + 1).kernels == Names{"fj_gemm", "fj_finalize", "fj_apply"});
  // A run of few rows through a two-pass set stays two-pass (the set has no single-pass GEMM).
  CHECK(schedule(p, config(), 2).kernels == Names{"fj_gemm", "fj_apply_fold", "fj_bump"});
  // exact_m: the set is exactly the one schedule.
  KernelConfig exact = config();
  exact.exact_m = true;
  CHECK(kernel_set(p, exact) == schedule(p, exact).kernels);
  // Every kernel a run may launch is in the set, for every M of the class.
  for (std::int64_t rows = 2; rows <= p.M; rows += 37)
    for (const auto& k : schedule(p, config(), rows).kernels) {
      const Names set = kernel_set(p, config());
      CHECK_MESSAGE(std::find(set.begin(), set.end(), k) != set.end(), k, " rows=", rows);
    }
}

TEST_CASE("exact_m round-trips through the config key") {
  KernelConfig c = config();
  c.exact_m = true;
  CHECK(c.key() == "tiled.128x128x32.w2x4.s4.g8.xm");
  CHECK(KernelConfig::parse(c.key()).exact_m);
  CHECK(KernelConfig::parse(c.key()).key() == c.key());
  KernelConfig w = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.xm");
  CHECK(w.exact_m);
  CHECK(w.tma_store);
  CHECK(w.key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.xm");
  CHECK(!KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8.k4").exact_m);
  CHECK(KernelConfig::parse("tiled.128x128x32.w2x4.s4.g8.k4.xm").split_k == 4);
}

TEST_CASE("schedule_flags makes schedule's decisions without the names") {
  for (const Mode mode : {Mode::train, Mode::eval})
    for (const std::optional<double> momentum :
         {std::optional<double>(0.1), std::optional<double>()})
      for (const char* key : {"tiled.128x128x32.w2x4.s4.g8", "tiled.128x128x32.w2x4.s4.g8.k4"})
        for (const std::int64_t M : {64, 1000, 4000}) {
          Problem p = problem();
          p.M = M, p.K = 1000, p.mode = mode, p.momentum = momentum;
          const KernelConfig c = KernelConfig::parse(key);
          for (const std::int64_t rows : {std::int64_t{2}, M / 2 + 1, M}) {
            const KernelSchedule named = schedule(p, c, rows), flags = schedule_flags(p, c, rows);
            CHECK(flags.kernels.empty());
            auto has = [&](const char* k) {
              return std::find(named.kernels.begin(), named.kernels.end(), k) !=
                     named.kernels.end();
            };
            CHECK(flags.finalize == has("fj_finalize"));
            CHECK(flags.apply == (has("fj_apply") || has("fj_apply_fold")));
            CHECK(flags.bump == has("fj_bump"));
            CHECK(flags.split_k == has("fj_splitk_reduce"));
            CHECK(flags.fold_finalize == has("fj_apply_fold"));
          }
        }
}

TEST_CASE("pad_operands: the copy kernel runs first, and only padded sets name KP") {
  Problem p = problem();
  p.K = 67;  // 134-byte bf16 rows: TMA cannot load them
  for (Mode m : {Mode::train, Mode::eval}) {
    CAPTURE(static_cast<int>(m));
    p.mode = m;
    for (const char* key : {"warpspec.128x128x64.c2.s6.g8.cl1.p1.pad",
                            "warpspec.128x128x64.c2.s6.g8.cl1.p1.pad.rc"}) {
      CAPTURE(key);
      const KernelConfig c = KernelConfig::parse(key);
      if (c.recompute && m == Mode::eval) continue;
      const std::vector<std::string> k = kernel_set(p, c);
      REQUIRE(!k.empty());
      CHECK(k.front() == "fj_pad_operands");
      CHECK(std::count(k.begin(), k.end(), "fj_pad_operands") == 1);
      for (const std::int64_t rows : {std::int64_t{2}, std::int64_t{129}, p.M})
        CHECK(schedule_flags(p, c, rows).pad);
      const KernelSource src = generate(p, c);
      // K rounded up to 128 bytes; LDX and LDW stay the caller's (the copy reads them).
      CHECK(src.text.find("static constexpr int KP = 128;") != std::string::npos);
      CHECK(src.text.find("static constexpr int LDX = 67, LDW = 67") != std::string::npos);
      CHECK(src.text.find("fj_pad_operands(const fj::Params p)") != std::string::npos);
      CHECK(compile(src, "sm_90a").binary.size() > 0);
    }
  }
  // An aligned problem's source is as it was: no KP, no copy.
  const KernelSource plain =
      generate(problem(), KernelConfig::parse("warpspec.128x128x64.c2.s6.g8.cl1.p1"));
  CHECK(plain.text.find("KP") == std::string::npos);
  CHECK(plain.text.find("pad_operands") == std::string::npos);
}

TEST_CASE("grid_sync: recompute's kernel set, its fj_gemm alone names GRID_SYNC, compiles") {
  Problem p = problem();
  p.mode = Mode::train;
  p.M = 2048;
  const KernelConfig gs = KernelConfig::parse("warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.gs");
  KernelConfig rc = gs;
  rc.grid_sync = false;
  // The same kernels as recompute (its fallback), whatever the rows.
  CHECK(kernel_set(p, gs) == kernel_set(p, rc));
  for (const std::int64_t rows : {std::int64_t{200}, p.M})
    CHECK(schedule(p, gs, rows).kernels == schedule(p, rc, rows).kernels);
  // Given the device's capacity (PlanCore::resident_tiles): fj_gemm alone up to that many
  // tiles, recompute's kernels beyond. 2048 rows x 200 columns in 128x256 tiles: 16 tiles.
  CHECK(schedule(p, gs, p.M, 16).kernels == std::vector<std::string>{"fj_gemm"});
  CHECK(schedule_flags(p, gs, p.M, 16).grid_sync);
  CHECK(schedule(p, gs, p.M, 15).kernels == schedule(p, rc, p.M).kernels);
  CHECK(schedule(p, gs, 1920, 15).kernels == std::vector<std::string>{"fj_gemm"});  // 15 tiles
  CHECK(schedule(p, rc, p.M, 132).kernels == schedule(p, rc, p.M).kernels);         // not grid_sync
  // The capacity rule: one tile per CTA; a persistent grid has at most one CTA per SM.
  CHECK(resident_tiles(gs, 2, 132) == 132);  // gs is persistent
  KernelConfig gs_p0 = gs;
  gs_p0.persistent = false;
  CHECK(resident_tiles(gs_p0, 2, 132) == 264);
  CHECK(resident_tiles(rc, 2, 132) == 0);
  // The resident grid: every tile when they fit; otherwise (persistent) every row tile of as
  // many column panels as fit, the last round holding what is left. 128x256 tiles.
  CHECK(resident_grid(gs, 2048, 2048, 132) == 128);     // 16 x 8 tiles: one round
  CHECK(resident_grid(gs, 2048, 2048, 100) == 96);      // 16 x 6, then 16 x 2
  CHECK(resident_grid(gs, 7 * 256, 2048, 100) == 96);   // 7 column tiles: 6, then 1
  CHECK(resident_grid(gs, 4096, 4096, 132) == 128);     // 32 x 4, four rounds
  CHECK(resident_grid(gs, 4096, 2100, 132) == 119);     // 17 x 7: 7, 7, then 2 panels
  CHECK(resident_grid(gs, 4096, 16384, 132) == 128);    // 128 x 1, 16 rounds
  CHECK(resident_grid(gs, 4096, 16385, 132) == 129);    // 129 row tiles x 1, 16 rounds
  CHECK(resident_grid(gs, 4096, 20000, 132) == 0);      // 157 row tiles do not fit
  CHECK(resident_grid(gs_p0, 2048, 2048, 264) == 128);  // not persistent: one round only
  CHECK(resident_grid(gs_p0, 2048, 4096, 100) == 0);
  CHECK(resident_grid(rc, 2048, 2048, 132) == 0);
  CHECK(resident_grid(gs, 2048, 0, 132) == 0);
  // A run whose tiles do not all fit goes resident in rounds (fj_gemm alone) when a panel's
  // row tiles do, recompute's kernels when they do not.
  Problem wide = p;
  wide.N = 2048;
  wide.ldw = wide.ldy = 0;
  wide.M = 20000;
  CHECK(schedule(wide, gs, 9000, 132).kernels == std::vector<std::string>{"fj_gemm"});
  CHECK(schedule(wide, gs, 20000, 132).kernels == schedule(wide, rc, 20000).kernels);
  const KernelSource src = generate(p, gs);
  // Spec says GRID_SYNC; SpecAffine, the fallback's second pass, must not inherit it.
  const auto spec = src.text.find("struct Spec {");
  const auto affine = src.text.find("struct SpecAffine : Spec {");
  REQUIRE(spec != std::string::npos);
  REQUIRE(affine != std::string::npos);
  const auto on = src.text.find("static constexpr bool GRID_SYNC = true;");
  const auto off = src.text.find("static constexpr bool GRID_SYNC = false;");
  CHECK((on > spec && on < affine));
  CHECK(off > affine);
  CHECK(generate(p, rc).text.find("GRID_SYNC") == std::string::npos);
  CHECK(compile(src, "sm_90a").binary.size() > 0);
}

TEST_CASE("overlap_apply: fj_gemm alone, the two-pass passes kept for a refused launch, compiles") {
  Problem p = problem();
  p.mode = Mode::train;
  p.M = 4096;
  for (const char* key :
       {"warpspec.128x256x64.c2.s4.g4.cl1.p1.ts.oa", "warpspec.128x128x64.c2.s5.g2.cl1.p1.oa.xm"}) {
    CAPTURE(key);
    const KernelConfig oa = KernelConfig::parse(key);
    KernelConfig two = oa;
    two.overlap_apply = false;
    // Every run: the GEMM alone, which merges, applies and bumps (no fj_bump with momentum=None).
    for (const std::int64_t rows : {std::int64_t{100}, std::int64_t{1000}, p.M}) {
      CAPTURE(rows);
      CHECK(schedule(p, oa, rows).kernels == std::vector<std::string>{"fj_gemm"});
      CHECK(schedule_flags(p, oa, rows).overlap);
      CHECK(!schedule_flags(p, two, rows).overlap);
    }
    Problem cumulative = p;
    cumulative.momentum.reset();
    CHECK(schedule(cumulative, oa, p.M).kernels == std::vector<std::string>{"fj_gemm"});
    // The set keeps what the fallback launches (launch.cpp): fj_finalize and fj_apply.
    const std::vector<std::string> set = kernel_set(p, oa);
    for (const char* k : {"fj_gemm", "fj_finalize", "fj_apply"})
      CHECK(std::find(set.begin(), set.end(), k) != set.end());
    // Only overlap_apply sets name OVERLAP_APPLY; the kernel static_asserts that the host's
    // shared-memory count (its 32 bytes included) is its layout's, so compiling checks both.
    const KernelSource src = generate(p, oa);
    CHECK(src.text.find("static constexpr bool OVERLAP_APPLY = true;") != std::string::npos);
    CHECK(generate(p, two).text.find("OVERLAP_APPLY") == std::string::npos);
    CHECK(compile(src, "sm_90a").binary.size() > 0);
  }
}

TEST_CASE(
    "input_stats: fj_input_stats first, recompute's kernels kept for a refused launch, compiles") {
  struct Case {
    DType dtype;
    const char* key;
    const char* arch;
  };
  for (const Case& one :
       {Case{DType::bf16, "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts.rc.cv", "sm_90a"},
        Case{DType::tf32x3, "warpspec.128x128x32.c2.s3.g8.cl1.p1.rc.cv", "sm_90a"},
        Case{DType::fp32, "tiled.128x128x32.w2x4.s3.g8.rc.cv", "sm_80"},
        Case{DType::fp16, "tiled.128x128x32.w2x4.s3.g8.rc.cv.xm", "sm_86"}}) {
    // Plain names: doctest's CAPTURE is a lambda, which a structured binding cannot be captured
    // by before C++20 compilers agree on it.
    const DType dtype = one.dtype;
    const char* key = one.key;
    const char* arch = one.arch;
    CAPTURE(key);
    // K = 40 pads to 64; K = 8 (16-bit) or 12 (fp32) to 16, rows of 16 or 48 bytes (TMA's
    // 16-byte alignment).
    const std::int64_t small_k = storage_bytes(dtype) == 2 ? 8 : 12;
    for (const std::int64_t k : {std::int64_t{40}, small_k}) {
      CAPTURE(k);
      Problem p = problem();
      p.dtype = dtype, p.mode = Mode::train, p.M = 3000, p.K = k;
      const KernelConfig cv = KernelConfig::parse(key);
      REQUIRE_MESSAGE(cv.valid_for(p, Device::for_arch(arch)),
                      cv.why_invalid(p, Device::for_arch(arch)));
      KernelConfig rc = cv;
      rc.input_stats = false;
      const std::vector<std::string> want{"fj_input_stats", "fj_gemm", "fj_finalize",
                                          "fj_gemm_affine"};
      CHECK(schedule(p, cv, p.M).kernels == want);
      CHECK(kernel_set(p, cv) == want);
      CHECK(schedule_flags(p, cv, 500).input_stats);
      CHECK(!schedule_flags(p, rc, p.M).input_stats);
      // The set's other kernels are recompute's own (they run only where the driver refuses
      // fj_input_stats' cooperative launch): the two texts differ by fj_input_stats alone
      // (its include and its kernel's lines) and the name in their first line.
      const KernelSource src = generate(p, cv);
      const auto without_input_stats = [](const std::string& text) {
        std::string kept;
        std::size_t at = text.find('\n') + 1;  // past the name
        while (at < text.size()) {
          const std::size_t end = std::min(text.find('\n', at), text.size());
          const std::string line = text.substr(at, end - at);
          if (line.find("input_stats") == std::string::npos &&
              line.find("InputStats") == std::string::npos)
            kept += line + "\n";
          at = end + 1;
        }
        return kept;
      };
      CHECK(src.text.find("kernels/input_stats.cuh") != std::string::npos);
      CHECK(without_input_stats(src.text) == without_input_stats(generate(p, rc).text));
      CHECK(compile(src, arch).binary.size() > 0);
    }
  }
}
