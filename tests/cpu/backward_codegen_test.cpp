// The backward kernel set without a GPU: what it holds per mode, that its source names no M,
// the slab split and workspace layout the host and kernels share, and that every backward set
// compiles with NVRTC for every supported architecture.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "common/backward_shape.h"
#include "common/split_k.h"
#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/plan/launch.hpp"
#include "fusejit/tune/backward_tuner.hpp"
#include "test_nvrtc_jobs.hpp"
#include "tools/sweep.hpp"

using namespace fusejit;

TEST_CASE("backward kernel set per mode and split") {
  Problem p = parse_sweep_line("300x72x40 bf16 train").problem;
  BackwardConfig c{KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8"),
                   KernelConfig::parse("warpspec.64x64x64.c1.s8.g8.cl1.p1")};
  // Train writes its parameter gradients in fj_bwd_coef (dbias = 0 exactly): no fj_bwd_params.
  CHECK(backward_kernel_set(p, c) ==
        std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_coef", "fj_bwd_da", "fj_bwd_resident",
                                 "fj_bwd_resident_shared", "fj_bwd_dx", "fj_bwd_dw"});
  p.mode = Mode::eval;
  CHECK(backward_kernel_set(p, c) ==
        std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_params", "fj_bwd_dx", "fj_bwd_dw"});
  // A split GEMM's slices are added by its sum kernel, launched right after it.
  c.dw.split_k = 4;
  CHECK(backward_kernel_set(p, c) == std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_params",
                                                              "fj_bwd_dx", "fj_bwd_dw",
                                                              "fj_bwd_dw_sum"});
  c.dx.split_k = 2;
  CHECK(backward_kernel_set(p, c) == std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_params",
                                                              "fj_bwd_dx", "fj_bwd_dx_sum",
                                                              "fj_bwd_dw", "fj_bwd_dw_sum"});
}

TEST_CASE("a backward source names no M: one kernel set for every batch size") {
  const Device dev = Device::for_arch("sm_90a");
  const Problem a = parse_sweep_line("300x72x40 bf16 train").problem;
  Problem b = a;
  b.M = 4096;
  // The config is chosen at one M (the dW GEMM's reduction is M): force the same one.
  const BackwardConfig c = default_backward_config(a, dev);
  const KernelSource sa = generate_backward(a, c), sb = generate_backward(b, c);
  CHECK(sa.text == sb.text);
  CHECK(sa.name == sb.name);
  CHECK(sa.text.find("300") == std::string::npos);
  // dx = da W: A (da) K-major, B (W) MN-major; dW = da^T x: both MN-major, reduction the run's M.
  CHECK(sa.text.find("struct DxSpec") != std::string::npos);
  CHECK(sa.text.find("ROWS = 0, COLS = 40, RED = 72") != std::string::npos);
  CHECK(sa.text.find("ROWS = 72, COLS = 40, RED = 0") != std::string::npos);
}

TEST_CASE("a backward source names no momentum: one binary for every momentum") {
  // No backward kernel reads it, and backward tuning entries are filed without it; a source
  // that named it (its comment did) gave each momentum its own cache key, so `fusejit compile
  // --from-db` warmed only the default momentum's.
  const Device dev = Device::for_arch("sm_90a");
  for (const char* line : {"300x72x40 bf16 train", "300x72x40 fp16 eval"}) {
    CAPTURE(std::string(line));
    const Problem a = parse_sweep_line(line).problem;
    const BackwardConfig c = default_backward_config(a, dev);
    for (const char* m : {"momentum=0.01", "momentum=none"}) {
      const Problem b = parse_sweep_line(std::string(line) + " " + m).problem;
      REQUIRE(b.key() != a.key());
      CHECK(generate_backward(b, c).text == generate_backward(a, c).text);
    }
  }
}

TEST_CASE("backward slabs cover the rows exactly, bounded in count") {
  for (const int strips : {1, 2, 8, 64, 1000}) {
    CAPTURE(strips);
    // Narrow layers (few strips) may take more slabs, up to a grid of kBackwardTargetBlocks.
    const long long cap = std::max<long long>(fj::kBackwardMaxSlabs,
                                              (fj::kBackwardTargetBlocks + strips - 1) / strips);
    CHECK(fj::backward_slab_cap(strips) == cap);
    for (long long m : {1LL, 2LL, 7LL, 63LL, 64LL, 65LL, 300LL, 4096LL, 4097LL, 65536LL, 1000003LL,
                        2147483391LL}) {
      CAPTURE(m);
      const fj::BackwardSlabs s = fj::backward_slabs(m, strips);
      CHECK(s.count >= 1);
      CHECK(s.count <= cap);
      CHECK(s.rows % fj::kBackwardRowThreads == 0);
      CHECK(static_cast<long long>(s.count) * s.rows >= m);
      CHECK(static_cast<long long>(s.count - 1) * s.rows < m);
    }
    // The bound a plan's workspace is laid out with covers every run of fewer rows.
    for (long long big : {64LL, 4095LL, 4100LL, 20000LL, 70000LL})
      for (long long m = 1; m <= big; m += 7) {
        CHECK(fj::backward_slabs(m, strips).count <= fj::backward_slab_bound(big, strips));
        CHECK(fj::backward_slab_bound(m, strips) <= fj::backward_slab_bound(big, strips));
      }
  }
  // The host's strip count is the kernels' (BackwardShape: 32 threads x 8 bytes of columns).
  CHECK(fj::backward_strips(256, 16, 2) == 2);
  CHECK(fj::backward_strips(257, 16, 2) == 3);
  CHECK(fj::backward_strips(256, 4, 4) == 8);
  CHECK(fj::backward_strips(100, 2, 2) == 4);
}

TEST_CASE("backward workspace: aligned regions, growing with the rows") {
  const Problem p = parse_sweep_line("5000x136x96 fp16 train").problem;
  const BackwardConfig unsplit{KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8"),
                               KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8")};
  BackwardConfig split = unsplit;
  split.dx.split_k = 2;
  split.dw.split_k = 8;
  std::size_t last = 0;
  for (std::int64_t rows : {2, 64, 65, 1000, 5000}) {
    CAPTURE(rows);
    const BackwardWorkspace w = backward_workspace(p, unsplit, rows, 0);
    for (std::size_t o : {w.dy_partials_offset, w.dz_partials_offset, w.coef_offset,
                          w.strip_ready_offset, w.da_offset})
      CHECK(o % kWorkspaceAlign == 0);
    // Train: fj_bwd_resident's strip counters, a u32 per strip, between the coefficients and da.
    const int strips = backward_layer_strips(p);
    CHECK(strips == 2);
    CHECK(w.strip_ready_offset >= w.coef_offset + 136 * 16);
    CHECK(w.da_offset >= w.strip_ready_offset + static_cast<std::size_t>(strips) * 4);
    // Only eval sums dz over slabs (fj_bwd_params): train's region of dz partials is empty,
    // eval's holds a float2 per slab and column.
    CHECK(w.coef_offset == w.dz_partials_offset);
    Problem e = p;
    e.mode = Mode::eval;
    const BackwardWorkspace we = backward_workspace(e, unsplit, rows, 0);
    CHECK(we.coef_offset >= we.dz_partials_offset + 136 * 8);
    CHECK(we.da_offset == we.strip_ready_offset);  // eval has no counters
    CHECK(w.da_offset + static_cast<std::size_t>(rows) * 136 * 2 <= w.total);
    CHECK(w.total >= last);
    last = w.total;
    // Split: S fp32 slices of [rows][ld] (dX) and [N][ld] (dW), ld = 96 rounded up to 8.
    const BackwardWorkspace s = backward_workspace(p, split, rows, 0);
    CHECK(s.da_offset == w.da_offset);
    CHECK(s.dx_slices_offset % kWorkspaceAlign == 0);
    CHECK(s.dw_slices_offset % kWorkspaceAlign == 0);
    CHECK(s.dx_slices_offset >= w.da_offset + static_cast<std::size_t>(rows) * 136 * 2);
    CHECK(s.dw_slices_offset >= s.dx_slices_offset + 2 * static_cast<std::size_t>(rows) * 96 * 4);
    CHECK(s.total >= s.dw_slices_offset + 8 * std::size_t{136} * 96 * 4);
  }
  CHECK(fj::split_slice_ld(96) == 96);
  CHECK(fj::split_slice_ld(97) == 104);
  CHECK(fj::split_slice_ld(1) == 8);
}

TEST_CASE("every backward kernel set compiles for every supported architecture") {
  const std::vector<std::string> archs = fusejit::test::supported_archs();
  std::vector<fusejit::test::CompileJob> jobs;
  const char* lines[] = {
      "300x72x40 {} train", "300x72x40 {} eval", "300x7x5 {} train same nobias noscale noaffine",
      "300x72x40 {} eval ldx=48 ldw=56 ldy=80 momentum=none", "100x10x6 {} train align=4"};
  for (const auto& arch : archs) {
    const Device dev = Device::for_arch(arch);
    // Every case on the two archs whose code paths differ most; the two modes on the others
    // (the CI machine compiles them all on two cores).
    const bool all = arch == "sm_80" || arch == "sm_90a";
    for (const char* dt : {"fp32", "tf32", "fp16", "bf16", "tf32x3"})
      for (const char* l : lines) {
        if (!all && l != lines[0] && l != lines[1]) continue;
        const Problem p = parse_sweep_line(fmt::format(fmt::runtime(l), dt)).problem;
        const BackwardConfig c = default_backward_config(p, dev);
        jobs.push_back({arch, generate_backward(p, c)});
        // Strict fp32's default runs its GEMMs on cuBLASLt; its own tiles stay candidates.
        if (c.dx_cublaslt || c.dw_cublaslt)
          jobs.push_back({arch, generate_backward(p, default_backward_tiles(p, dev))});
      }
  }
  MESSAGE(jobs.size() << " backward kernel sets over " << archs.size() << " architectures");
  const std::string failures = fusejit::test::compile_jobs(jobs, fusejit::test::Coverage::sampled);
  CHECK_MESSAGE(failures.empty(), failures);
}

TEST_CASE("the gradient GEMMs copy da at its own width, W, x and C at the layer's") {
  const BackwardConfig tiled{KernelConfig::parse("tiled.128x64x64.w4x1.s3.g8"),
                             KernelConfig::parse("tiled.128x256x64.w2x4.s3.g8")};
  struct Case {
    const char* line;
    int da, layer;
  };
  for (const Case& c : {
           // K odd in bf16: x's and W's rows 4-byte aligned, da's 16.
           Case{"777x1536x2050 bf16 train", 16, 4},
           // N = 1502 limits, through y's rows, the layer's promise; da's rows are padded to 1504.
           Case{"777x1502x2048 bf16 train", 16, 4},
           Case{"300x70x40 bf16 train ldx=48 ldw=48 ldy=72", 16, 16},
           Case{"300x72x40 tf32 eval", 16, 16},
       }) {
    CAPTURE(c.line);
    const Problem p = parse_sweep_line(c.line).problem;
    const GradGemmVecBytes v = grad_gemm_vec_bytes(p);
    CHECK(v.da == c.da);
    CHECK(v.layer == c.layer);
    const std::string text = generate_backward(p, tiled).text;
    const std::string widths =
        fmt::format("VEC_BYTES = {}, A_VEC_BYTES = {}, B_VEC_BYTES = {};", c.layer, c.da, c.layer);
    // Both Specs, DxSpec's first.
    const std::size_t dx = text.find("struct DxSpec"), dw = text.find("struct DwSpec");
    REQUIRE(dx != std::string::npos);
    REQUIRE(dw != std::string::npos);
    CHECK(text.find(widths, dx) < dw);
    CHECK(text.find(widths, dw) != std::string::npos);
  }
  // da's rows are N padded to 16 bytes, in the Spec fj_bwd_da writes by, the GEMMs' LDA and the
  // workspace.
  struct Padded {
    const char* line;
    std::int64_t ld;
  };
  for (const Padded& c : {Padded{"300x66x40 bf16 train", 72}, Padded{"300x66x40 tf32 eval", 68},
                          Padded{"300x67x40 fp16 train", 72}, Padded{"300x72x40 fp16 train", 72}}) {
    CAPTURE(c.line);
    const Problem p = parse_sweep_line(c.line).problem;
    const std::int64_t ld = grad_da_row_elements(p);
    CHECK(ld == c.ld);
    const std::string text = generate_backward(p, tiled).text;
    CHECK(text.find(fmt::format("LDDA = {},", ld)) != std::string::npos);
    // Both tiled GEMMs read da with that stride.
    const std::size_t dx = text.find("struct DxSpec"), dw = text.find("struct DwSpec");
    REQUIRE(dx != std::string::npos);
    REQUIRE(dw != std::string::npos);
    CHECK(text.find(fmt::format("LDA = {}, LDB", ld), dx) < dw);
    CHECK(text.find(fmt::format("LDA = {}, LDB", ld), dw) != std::string::npos);
    const BackwardWorkspace w = backward_workspace(p, tiled, 300, 0);
    // The region after da's starts past its padded rows.
    CHECK(w.dx_slices_offset >=
          w.da_offset + std::size_t{300} * static_cast<std::size_t>(ld) * storage_bytes(p.dtype));
  }
}

TEST_CASE("tf32x3: BackwardPlan takes it; its gradient GEMMs are strict fp32's") {
  const Problem p = parse_sweep_line("300x72x40 tf32x3 train").problem;
  CHECK(backward_refusal(p).empty());
  Problem strict = p;
  strict.dtype = DType::fp32;
  for (const char* arch : {"sm_80", "sm_90a"}) {
    CAPTURE(arch);
    const Device dev = Device::for_arch(arch);
    // fp32's choice (cuBLASLt's strict SGEMM), candidates and ranking (the FFMA kernels),
    // fp32's math in the Specs, tf32x3's storage type and key.
    CHECK(default_backward_config(p, dev).key() == "dx.cublaslt.dw.cublaslt");
    CHECK(default_backward_config(strict, dev).key() == "dx.cublaslt.dw.cublaslt");
    CHECK(default_backward_tiles(p, dev).key() == default_backward_tiles(strict, dev).key());
    const KernelSource src = generate_backward(p, default_backward_tiles(p, dev));
    CHECK(src.text.find("MATH = fj::kMathSimtFp32") != std::string::npos);
    CHECK(src.text.find("kMathTf32x3") == std::string::npos);
    CHECK(src.name.find("tf32x3") != std::string::npos);
  }
  CHECK(dx_gemm_problem(p).dtype == DType::fp32);
  CHECK(dw_gemm_problem(p).dtype == DType::fp32);
}

TEST_CASE("warpspec gradient GEMMs: which configs they take, and every one compiles for sm_90a") {
  const Device hopper = Device::for_arch("sm_90a");
  const Problem p = parse_sweep_line("300x72x40 bf16 train").problem;
  // The heuristic picks them on Hopper for 16-bit types and tf32, never elsewhere; tf32's read
  // K-major copies with padded rows (grad_gemm_reads_copies), 16-bit ones the operands in place
  // where their rows are 16-byte aligned and copies of x and W where not.
  CHECK(default_backward_config(p, hopper).dx.variant == Variant::warpspec);
  CHECK(default_backward_config(p, hopper).dw.variant == Variant::warpspec);
  CHECK(default_backward_config(p, Device::for_arch("sm_80")).dx.variant == Variant::tiled);
  CHECK(!grad_gemm_reads_copies(p, default_backward_config(p, hopper).dx));
  // Copies of x and W (and tf32's of dA) for tf32, and for 16-bit layers whose rows TMA cannot
  // load (N = 60: y's 120 bytes bound the one alignment promise; a padded x; odd K and N); a
  // 16-bit dW reads dA in place, MN-major.
  for (const char* line :
       {"300x72x40 tf32 train", "300x72x42 tf32 train", "300x70x40 tf32 train",
        "300x72x41 tf32 train",
        "4096x4096x4096 tf32 train ldx=4098 ldw=4098" /* packed, it takes TMA stores */,
        "300x60x40 bf16 train", "300x72x40 bf16 train ldx=44", "4097x4095x129 bf16 train",
        "777x1536x2050 fp16 train"}) {
    CAPTURE(std::string(line));
    const Problem q = parse_sweep_line(line).problem;
    const bool tf32 = q.dtype == DType::tf32;
    const BackwardConfig c = default_backward_config(q, hopper);
    CHECK(c.dx.variant == Variant::warpspec);
    CHECK(c.dw.variant == Variant::warpspec);
    CHECK(grad_gemm_reads_copies(q, c.dx));
    CHECK(grad_gemm_reads_copies(q, c.dw));
    CHECK(grad_gemm_reads_da_copy(q, c.dw) == tf32);
    if (q.effective_alignment() < 16) CHECK((!c.dx.tma_store && !c.dw.tma_store));
    CHECK(backward_kernel_set(q, c) ==
          std::vector<std::string>{"fj_bwd_reduce", "fj_bwd_coef", "fj_bwd_da", "fj_bwd_resident",
                                   "fj_bwd_resident_shared", "fj_bwd_transpose", "fj_bwd_dx",
                                   "fj_bwd_dw"});
    // dX reads both operands K-major (dA in place, W^T); dW reads x^T K-major and dA^T (tf32)
    // or dA MN-major.
    const std::string text = generate_backward(q, c).text;
    const std::size_t dx = text.find("struct DxSpec"), dw = text.find("struct DwSpec");
    REQUIRE(dx != std::string::npos);
    REQUIRE(dw != std::string::npos);
    CHECK(text.find("A_MN_MAJOR = false, B_MN_MAJOR = false", dx) < dw);
    CHECK(text.find(tf32 ? "A_MN_MAJOR = false, B_MN_MAJOR = false"
                         : "A_MN_MAJOR = true, B_MN_MAJOR = false",
                    dw) != std::string::npos);
  }
  for (const char* line : {"300x72x40 tf32x3 train", "300x72x40 fp32 eval"}) {
    CAPTURE(std::string(line));
    const Problem q = parse_sweep_line(line).problem;
    const BackwardConfig c = default_backward_config(q, hopper);
    CHECK(c.dx.variant == Variant::tiled);
    CHECK(c.dw.variant == Variant::tiled);
  }
  // Split-K where a GEMM's tiles fill at most half the GPU: dW of a narrow layer (N x K = 256 x 64
  // is a few tiles, its reduction the batch), not the GEMMs of a wide one.
  const BackwardConfig narrow =
      default_backward_config(parse_sweep_line("65536x256x64 bf16 train").problem, hopper);
  CHECK(narrow.dw.split_k > 1);
  CHECK(narrow.dx.split_k == 1);
  const BackwardConfig wide =
      default_backward_config(parse_sweep_line("4096x4096x4096 bf16 train").problem, hopper);
  CHECK(wide.dx.split_k == 1);
  CHECK(wide.dw.split_k == 1);
  // Nor where the reduction is short (1024 rows: 16 k tiles), nor where small tiles fill the GPU.
  for (const char* line : {"1024x256x64 bf16 train", "2048x2048x512 bf16 train"}) {
    CAPTURE(std::string(line));
    const BackwardConfig c = default_backward_config(parse_sweep_line(line).problem, hopper);
    CHECK(c.dx.split_k == 1);
    CHECK(c.dw.split_k == 1);
  }
  // At most one split twin per unsplit candidate, and none of the forward's own (add_split_k:
  // 1024 rows are 16 k tiles, which the forward would split on sm_80).
  for (const Device& dev : {hopper, Device::for_arch("sm_80")}) {
    const Problem q = parse_sweep_line("65536x256x64 bf16 train").problem;
    std::set<std::string> bases, unsplit;
    for (const KernelConfig& c : grad_gemm_candidates(q, backward_gemms(q).dw, true, dev)) {
      KernelConfig base = c;
      base.split_k = 1;
      if (c.split_k == 1)
        unsplit.insert(c.key());
      else
        CHECK(bases.insert(base.key()).second);
    }
    CHECK(!bases.empty());
    for (const std::string& b : bases) CHECK(unsplit.count(b) == 1);
    const Problem short_k = parse_sweep_line("1024x256x64 bf16 train").problem;
    for (const KernelConfig& c :
         grad_gemm_candidates(short_k, backward_gemms(short_k).dw, true, dev))
      CHECK(c.split_k == 1);
  }
  // Where small tiles fill the GPU but large ones leave most SMs idle (4097x4095x129's dW: N x K
  // = 4095 x 129 in 128x256 tiles is 32 CTAs, its reduction the batch), the large tiles' split
  // twins are offered after warpspec's unsplit configs: the tuner times them, the heuristic's
  // pick stays unsplit. (dX's grid is ranked at the M class's 16384 rows, where it fills the
  // GPU: no twins.)
  {
    const Problem q = parse_sweep_line("4097x4095x129 bf16 train").problem;
    std::vector<KernelConfig> list = grad_gemm_candidates(q, backward_gemms(q).dw, true, hopper);
    REQUIRE(!list.empty());
    CHECK(list.front().split_k == 1);
    // Warpspec's list, then tiled's: the twins follow warpspec's unsplit configs.
    std::erase_if(list, [](const KernelConfig& c) { return c.variant != Variant::warpspec; });
    const auto first_twin =
        std::find_if(list.begin(), list.end(), [](const KernelConfig& c) { return c.split_k > 1; });
    REQUIRE(first_twin != list.end());
    CHECK(std::all_of(first_twin, list.end(), [](const KernelConfig& c) { return c.split_k > 1; }));
    CHECK(std::any_of(first_twin, list.end(), [](const KernelConfig& c) {
      return c.bm == 128 && c.bn == 256 && c.split_k == 4;
    }));
  }
  // The sanitizer sweep's split lines (tests/sanitize/backward_small.sweep) do split, tf32's on
  // warpspec (its K-major copies).
  CHECK(default_backward_config(parse_sweep_line("4100x64x40 bf16 train").problem, hopper)
            .dw.split_k > 1);
  {
    const BackwardConfig c =
        default_backward_config(parse_sweep_line("4100x40x24 tf32 train").problem, hopper);
    CHECK(c.dw.split_k > 1);
    CHECK(c.dw.variant == Variant::warpspec);
  }
  // fp32's (cuBLASLt by default): the FFMA tiles split under the sanitizer's "bwd_tiles".
  CHECK(
      default_backward_tiles(parse_sweep_line("4100x40x24 fp32 eval").problem, hopper).dw.split_k >
      1);
  // A gradient GEMM whose candidates are all one wave is ranked by its tiles' measured rates alone
  // on an SM and by its slices' traffic (estimated_us, GemmKind::gradient_one_wave). On H100
  // (`fusejit autotune --backward`, bf16 train, whole backward) 16384x1024x256's dW in 128x128
  // tiles and 8 splits was 8% faster than in 128x256 tiles and 16 (twice the fp32 slices), which
  // the forward's rules picked, and 4096x512x512's unsplit 64x64 tiles 12% faster than 128x128
  // tiles in 8 splits.
  CHECK(default_backward_tiles(parse_sweep_line("16384x1024x256 bf16 train").problem, hopper)
            .dw.key() == "warpspec.128x128x64.c2.s6.g8.cl1.p1.k8");
  CHECK(default_backward_tiles(parse_sweep_line("4096x512x512 bf16 train").problem, hopper)
            .dw.key() == "warpspec.64x64x64.c1.s8.g8.cl1.p1");
  // cuBLASLt takes a 16-bit GEMM of aligned rows (lt_beats_tiles) that the tiles would run
  // - as one wave of single consumers over a reduction of 4096 or more (dW of 4096x1024x1024 and
  //   8192x2048x512, dX of 1024x4096x1024): not over 2048 (2048x2048x512), not with two consumers
  //   (2048x4096x1024's dX), not tf32, not rows TMA cannot load (4097x4095x129), not the GPU's
  //   second wave (4096^3), not on sm_80;
  // - as a split dW of 128 columns or more (16384x1024x256, 8192x512x128), not of fewer
  //   (65536x256x64's 64);
  // - as two consumers that use at most 62% of their waves' SM slots over a reduction of 768 or
  //   more, counted at the M class's representative: dW of 1536^3 and 300x1536x1536 (72 tiles of
  //   128x256 over 2048 and 1024 rows); not 200x1536x1536's (over 256), not 1536x1536x1024's
  //   (96 tiles of 128x128), not 512x2048x2048's (128 tiles), nor the dX of 512x2048x2048 (64
  //   tiles at 512 rows, 128 at its class's 1024).
  // Both GEMMs where both qualify (4096x4096x256).
  struct LtCase {
    const char* line;
    bool dx, dw;
  };
  for (const LtCase& k : {LtCase{"4096x1024x1024 bf16 train", false, true},
                          LtCase{"8192x2048x512 fp16 train", false, true},
                          LtCase{"1024x4096x1024 bf16 train", true, false},
                          LtCase{"2048x2048x512 bf16 train", false, false},
                          LtCase{"2048x4096x1024 bf16 train", false, false},
                          LtCase{"4096x1024x1024 tf32 train", false, false},
                          LtCase{"4097x4095x129 bf16 train", false, false},
                          LtCase{"4096x4096x4096 bf16 train", false, false},
                          LtCase{"16384x1024x256 bf16 train", false, true},
                          LtCase{"8192x512x128 bf16 train", false, true},
                          LtCase{"65536x256x64 bf16 train", false, false},
                          LtCase{"1536x1536x1536 bf16 train", false, true},
                          LtCase{"300x1536x1536 fp16 train", false, true},
                          LtCase{"200x1536x1536 bf16 train", false, false},
                          LtCase{"1536x1536x1024 bf16 train", false, false},
                          LtCase{"512x2048x2048 bf16 train", false, false},
                          LtCase{"4096x4096x256 bf16 train", true, true}}) {
    CAPTURE(std::string(k.line));
    const Problem q = parse_sweep_line(k.line).problem;
    const BackwardConfig c = default_backward_config(q, hopper);
    CHECK(c.dx_cublaslt == k.dx);
    CHECK(c.dw_cublaslt == k.dw);
    // The other GEMM keeps the heuristic's tiles.
    const BackwardConfig tiles = default_backward_tiles(q, hopper);
    if (!k.dx) CHECK(c.dx.key() == tiles.dx.key());
    if (!k.dw) CHECK(c.dw.key() == tiles.dw.key());
    // Where cuBLASLt declines the GEMM the heuristic gave it, the plan runs the tiles instead,
    // unless the caller forced that GEMM onto cuBLASLt.
    if (k.dx || k.dw) {
      const std::optional<BackwardConfig> back = lt_declined_fallback(c, tiles, false, false);
      REQUIRE(back.has_value());
      CHECK(back->key() == tiles.key());
      CHECK(!lt_declined_fallback(c, tiles, k.dx, k.dw).has_value());
      // One GEMM forced (onto its tiles): the heuristic's cuBLASLt GEMM still falls back.
      const std::optional<BackwardConfig> other = lt_declined_fallback(c, tiles, !k.dx, !k.dw);
      REQUIRE(other.has_value());
      CHECK(other->key() == tiles.key());
    }
    const BackwardConfig ampere = default_backward_config(q, Device::for_arch("sm_80"));
    CHECK(!ampere.dx_cublaslt);
    CHECK(!ampere.dw_cublaslt);
  }
  // A plan counts its class's dX grid again at its own M (plan_backward_config): the survey's
  // half-wave dXs move to cuBLASLt (384 and 512 rows of 2048x2048: 48 and 64 tiles of 128x128;
  // 1280x1536x1536: 60 tiles of 128x256; 2560x2048x2048: 160; 8192x2048x256: 64), the grids it
  // measured 73% or more full do not (768 and 1024 rows of 2048x2048, 1536x2048x2048), nor
  // 8192x512x128's over a reduction of 512, nor any seed layer, a dX the class already put on
  // cuBLASLt, tf32, or sm_80.
  struct MoveCase {
    const char* line;
    bool moves;
  };
  for (const MoveCase& k :
       {MoveCase{"384x2048x2048 bf16 train", true}, MoveCase{"512x2048x2048 bf16 train", true},
        MoveCase{"512x2048x2048 fp16 eval", true}, MoveCase{"1280x1536x1536 bf16 train", true},
        MoveCase{"2560x2048x2048 bf16 train", true}, MoveCase{"8192x2048x256 bf16 train", true},
        MoveCase{"768x2048x2048 bf16 train", false}, MoveCase{"1024x2048x2048 bf16 train", false},
        MoveCase{"1536x2048x2048 bf16 train", false}, MoveCase{"8192x512x128 bf16 train", false},
        MoveCase{"4096x4096x4096 bf16 train", false}, MoveCase{"1024x8192x8192 bf16 train", false},
        MoveCase{"16384x4096x4096 bf16 train", false}, MoveCase{"2048x2048x512 bf16 train", false},
        MoveCase{"65536x256x64 bf16 train", false}, MoveCase{"128x512x1024 bf16 train", false},
        MoveCase{"1024x4096x1024 bf16 train", false}, MoveCase{"512x2048x2048 tf32 train", false},
        MoveCase{"4097x4095x129 bf16 train", false}}) {
    CAPTURE(std::string(k.line));
    const Problem q = parse_sweep_line(k.line).problem;
    const BackwardConfig c = default_backward_config(q, hopper);
    const BackwardConfig run = plan_backward_config(q, c, hopper);
    CHECK(run.dx_cublaslt == (c.dx_cublaslt || k.moves));
    if (k.moves) CHECK_FALSE(c.dx_cublaslt);  // the class kept dX on tiles: the plan moved it
    if (!k.moves) CHECK(run.key() == c.key());
    CHECK(run.dw_key() == c.dw_key());  // only dX moves
    const Device ampere = Device::for_arch("sm_80");
    const BackwardConfig a = default_backward_config(q, ampere);
    CHECK(plan_backward_config(q, a, ampere).key() == a.key());
  }
  auto why = [&](const Problem& q, const char* key) {
    return grad_gemm_why_invalid(q, KernelConfig::parse(key), dw_gemm_problem(q), hopper);
  };
  CHECK(why(p, "warpspec.128x128x64.c2.s5.g8.cl2.p1").find("clusters") != std::string::npos);
  CHECK(why(p, "warpspec.128x128x64.c2.s5.g8.cl1.p1.pp").find("pingpong") != std::string::npos);
  // TMA stores through per-warp boxes (16 KiB at two consumers) leave a 128x256 tile its 4th
  // stage, not a 5th.
  CHECK(why(p, "warpspec.128x256x64.c2.s4.g8.cl1.p1.ts").empty());
  CHECK(why(p, "warpspec.128x256x64.c2.s5.g8.cl1.p1.ts").find("shared memory") !=
        std::string::npos);
  CHECK(wide.dx.key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts");
  CHECK(wide.dw.key() == "warpspec.128x256x64.c2.s4.g16.cl1.p1.ts");
  CHECK(why(parse_sweep_line("300x72x40 tf32 train").problem, "warpspec.128x128x32.c2.s5.g8.cl1.p1")
            .empty());
  CHECK(
      why(parse_sweep_line("300x72x40 tf32x3 train").problem, "warpspec.128x128x32.c2.s5.g8.cl1.p1")
          .find("strict fp32") != std::string::npos);
  // da's rows are padded, and x and W copied into padded rows where TMA cannot load them: any
  // alignment takes the thread stores, not TMA stores.
  CHECK(why(parse_sweep_line("300x70x40 tf32 train").problem, "warpspec.128x128x32.c2.s5.g8.cl1.p1")
            .empty());
  CHECK(why(parse_sweep_line("300x60x40 bf16 train").problem, "warpspec.128x128x64.c2.s5.g8.cl1.p1")
            .empty());
  CHECK(why(parse_sweep_line("4097x4095x129 bf16 train").problem,
            "warpspec.128x128x64.c2.s5.g8.cl1.p1.ts")
            .find("TMA stores need 16-byte") != std::string::npos);
  CHECK(why(parse_sweep_line("300x72x42 tf32 train").problem, "warpspec.128x128x32.c2.s5.g8.cl1.p1")
            .empty());
  CHECK(why(parse_sweep_line("300x72x64 tf32 train ldx=66 ldw=66").problem,
            "warpspec.128x128x32.c2.s5.g8.cl1.p1.ts")
            .find("TMA stores need 16-byte") != std::string::npos);
  CHECK(why(parse_sweep_line("300x72x41 tf32 train").problem, "warpspec.128x128x32.c2.s5.g8.cl1.p1")
            .empty());
  CHECK(why(p, "warpspec.64x64x64.c1.s8.g8.cl1.p1.k4.ts").find("tma_store") != std::string::npos);
  CHECK(why(p, "warpspec.64x64x64.c1.s8.g8.cl1.p1.k64").find("split_k") != std::string::npos);
  // Split-K on either variant, even with more splits than a run's reduction has k tiles.
  CHECK(why(p, "warpspec.64x64x64.c1.s8.g8.cl1.p1.k32").empty());
  CHECK(why(p, "tiled.64x64x64.w2x2.s3.g8.k16").empty());
  // The tile shapes the GPU test forces: accepted, and their sets compile. tf32's (K-major
  // copies): thread and TMA stores, one and two consumers.
  struct Tiles {
    const char *dx, *dw;
    std::vector<const char*> lines;
  };
  const std::vector<const char*> sixteen = {"300x72x40 bf16 train", "777x328x520 fp16 eval"};
  const std::vector<const char*> tf32 = {"300x72x40 tf32 train", "777x328x520 tf32 eval"};
  // 16-bit copies of x and W and element stores (odd K and N, a padded x).
  const std::vector<const char*> unaligned = {"301x71x41 bf16 train", "300x72x40 fp16 eval ldx=44"};
  const Tiles tiles[] = {
      {"warpspec.128x256x64.c2.s4.g16.cl1.p1", "warpspec.128x256x64.c2.s4.g16.cl1.p0", sixteen},
      {"warpspec.64x128x64.c1.s6.g8.cl1.p0", "warpspec.64x128x64.c1.s6.g8.cl1.p1", sixteen},
      {"warpspec.128x64x64.c2.s6.g8.cl1.p1", "warpspec.128x128x64.c1.s4.g8.cl1.p1", sixteen},
      {"warpspec.256x128x64.c2.s3.g8.cl1.p1", "warpspec.64x64x64.c1.s8.g8.cl1.p1", sixteen},
      {"warpspec.128x256x64.c2.s4.g16.cl1.p1.ts", "warpspec.64x128x64.c1.s6.g8.cl1.p0.ts", sixteen},
      {"warpspec.128x128x64.c1.s4.g8.cl1.p1.ts", "warpspec.128x64x64.c2.s6.g8.cl1.p0.ts", sixteen},
      {"warpspec.128x256x64.c2.s4.g16.cl1.p1.k4", "warpspec.64x64x64.c1.s8.g8.cl1.p1.k32", sixteen},
      {"warpspec.64x128x64.c1.s6.g8.cl1.p0.k3", "tiled.64x128x64.w2x2.s3.g8.k5", sixteen},
      {"warpspec.128x128x64.c2.s6.g8.cl1.p1.ts", "warpspec.64x128x64.c1.s6.g8.cl1.p1.k16", sixteen},
      {"warpspec.128x256x32.c2.s4.g16.cl1.p1.ts", "warpspec.128x128x32.c2.s6.g8.cl1.p1", tf32},
      {"warpspec.64x128x32.c1.s6.g8.cl1.p0.ts", "warpspec.128x128x32.c1.s4.g8.cl1.p1.ts", tf32},
      {"warpspec.128x128x32.c2.s6.g8.cl1.p1",
       "warpspec.64x128x32.c1.s6.g8.cl1.p0",
       {"301x71x41 tf32 train"}},
      {"warpspec.128x256x64.c2.s4.g16.cl1.p1", "warpspec.64x64x64.c1.s8.g8.cl1.p1.k8", unaligned},
      {"warpspec.64x128x64.c1.s6.g8.cl1.p0", "warpspec.128x128x64.c2.s6.g8.cl1.p1", unaligned}};
  std::vector<fusejit::test::CompileJob> jobs;
  for (const Tiles& pair : tiles) {
    // Named copies, not structured bindings: CAPTURE's lambda cannot capture those (clang 14).
    const std::string dx = pair.dx, dw = pair.dw;
    CAPTURE(dx);
    CAPTURE(dw);
    for (const char* line : pair.lines) {
      const Problem q = parse_sweep_line(line).problem;
      const BackwardConfig c{KernelConfig::parse(dx), KernelConfig::parse(dw)};
      CHECK(grad_gemm_why_invalid(q, c.dx, dx_gemm_problem(q), hopper) == "");
      CHECK(grad_gemm_why_invalid(q, c.dw, dw_gemm_problem(q), hopper) == "");
      jobs.push_back({"sm_90a", generate_backward(q, c)});
    }
  }
  const std::string failures = fusejit::test::compile_jobs(jobs, fusejit::test::Coverage::sampled);
  CHECK_MESSAGE(failures.empty(), failures);
}

TEST_CASE("the warpgroups' register budgets: the kernels' splits fit a CTA, 96 + 208 does not") {
  // register_budgets_fit (mainloop/wgmma.cuh) guards both warpspec kernels' setmaxnreg splits: a
  // gradient GEMM at 96 + 208 registers hung on the GPU (setmaxnreg.inc waited for registers the
  // launch never gave). Its own arithmetic, compiled by NVRTC: the splits the kernels use at 384
  // threads fit, and the one that hung does not.
  KernelSource src;
  src.name = "register_budgets_fit";
  src.text =
      "#include \"mainloop/wgmma.cuh\"\n"
      "static_assert(fj::register_budgets_fit(384, 40, 232, 2), \"40 + 232\");\n"
      "static_assert(fj::register_budgets_fit(384, 56, 224, 2), \"56 + 224\");\n"
      "static_assert(!fj::register_budgets_fit(384, 96, 208, 2), \"96 + 208\");\n"
      "static_assert(!fj::register_budgets_fit(384, 40, 240, 2), \"40 + 240\");\n";
  src.options = {"--std=c++17"};
  src.headers = template_headers();
  const std::string failures =
      fusejit::test::compile_jobs({{"sm_90a", src}}, fusejit::test::Coverage::every);
  CHECK_MESSAGE(failures.empty(), failures);
}

TEST_CASE("gradient GEMMs on cuBLASLt: strict fp32's default, keys, kernel sets, workspace") {
  const Device hopper = Device::for_arch("sm_90a");
  for (const char* line :
       {"300x72x40 fp32 train", "300x72x40 fp32 eval", "300x72x40 tf32x3 train"}) {
    CAPTURE(std::string(line));
    const Problem p = parse_sweep_line(line).problem;
    const BackwardConfig c = default_backward_config(p, hopper);
    CHECK(c.dx_cublaslt);
    CHECK(c.dw_cublaslt);
    CHECK(c.key() == "dx.cublaslt.dw.cublaslt");
    const BackwardConfig back = BackwardConfig::parse(c.key());
    CHECK((back.dx_cublaslt && back.dw_cublaslt));
    // Only the BatchNorm passes: no GEMM, split sum or copy kernel, and no GEMM Spec.
    for (const std::string& k : backward_kernel_set(p, c)) {
      CAPTURE(k);
      CHECK(k.find("_dx") == std::string::npos);
      CHECK(k.find("_dw") == std::string::npos);
      CHECK(k != "fj_bwd_transpose");
    }
    const KernelSource src = generate_backward(p, c);
    CHECK(src.text.find("DxSpec") == std::string::npos);
    CHECK(src.text.find("DwSpec") == std::string::npos);
    // cuBLASLt's workspace comes first, as large as asked; no split slices or copies.
    const BackwardWorkspace w = backward_workspace(p, c, 300, 5000);
    CHECK(w.lt_offset == 0);
    CHECK(w.dy_partials_offset >= 5000);
    CHECK(w.dx_slices_offset == w.dw_slices_offset);
    CHECK(w.w_t_offset == 0);
    CHECK(w.x_t_offset == 0);
    CHECK(w.total >= backward_workspace(p, c, 300, 0).total + 5000);
    CHECK(backward_config_why_invalid(p, c, hopper).empty());
  }
  // Tensor-core dtypes keep their tiles by default at these shapes (none of lt_beats_tiles' cases,
  // below); the tuner times each GEMM on cuBLASLt too, beside the
  // heuristic's other GEMM.
  for (const char* line : {"300x72x40 bf16 train", "300x72x40 tf32 eval", "300x72x40 fp32 train"}) {
    CAPTURE(std::string(line));
    const Problem p = parse_sweep_line(line).problem;
    const BackwardConfig h = default_backward_config(p, hopper);
    CHECK(h.dx_cublaslt == (p.dtype == DType::fp32));
    std::set<std::string> keys;
    for (const BackwardConfig& c : backward_tuning_configs(p, hopper)) keys.insert(c.key());
    CHECK(keys.count(h.key()) == 1);
    CHECK(keys.count(fmt::format("dx.cublaslt.dw.{}", h.dw_key())) == 1);
    CHECK(keys.count(fmt::format("dx.{}.dw.cublaslt", h.dx_key())) == 1);
    // A mixed pair: its one fused GEMM's kernels only.
    BackwardConfig mixed = default_backward_tiles(p, hopper);
    mixed.dw = {}, mixed.dw_cublaslt = true;
    CHECK(BackwardConfig::parse(mixed.key()).key() == mixed.key());
    const std::vector<std::string> k = backward_kernel_set(p, mixed);
    CHECK(std::count(k.begin(), k.end(), "fj_bwd_dx") == 1);
    CHECK(std::count(k.begin(), k.end(), "fj_bwd_dw") == 0);
  }
}

// What run() checks before launching: here the tensors' byte ranges (addresses only, nothing is
// dereferenced). The gradient GEMMs read x and W while they write dx and dW.
TEST_CASE("backward tensors: dx and dw must not overlap x, W or each other") {
  const Problem p = parse_sweep_line("100x56x32 bf16 train").problem;
  const std::uintptr_t x_span = ((p.M - 1) * p.lda_x() + p.K) * 2,
                       w_span = ((p.N - 1) * p.lda_w() + p.K) * 2;
  auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  BackwardTensors t;
  t.dy = at(0x10000000);
  t.saved = at(0x11000000);
  t.x = at(0x12000000);
  t.w = at(0x13000000);
  t.scale = at(0x14000000);
  t.gamma = at(0x14001000);
  t.save_mean = static_cast<const float*>(at(0x14002000));
  t.save_invstd = static_cast<const float*>(at(0x14003000));
  t.dx = at(0x15000000);
  t.dw = at(0x16000000);
  auto rejected = [&](const BackwardTensors& b, std::int64_t rows = 0) -> std::string {
    try {
      validate_backward_tensors(p, b, rows);
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return "(accepted)";
  };
  CHECK(rejected(t) == "(accepted)");
  BackwardTensors b = t;
  b.dx = at(0x12000000 + x_span - 16);  // x's last 16 bytes
  CHECK(rejected(b) == "dx");
  b.dx = at(0x12000000 + x_span);  // right after x
  CHECK(rejected(b) == "(accepted)");
  b.dx = at(0x13000000 + 64);
  CHECK(rejected(b) == "dx");
  b = t;
  b.dw = at(0x12000000 + 16 * 64);
  CHECK(rejected(b) == "dw");
  b.dw = at(0x13000000 + w_span - 16);
  CHECK(rejected(b) == "dw");
  b.dw = at(0x15000000 + 64);
  CHECK(rejected(b) == "dw");
  // Only the run's rows count: dx after x's first 10 rows overlaps a run of all 100 rows of x.
  b = t;
  b.dx = at(0x12000000 + 10 * p.lda_x() * 2);
  CHECK(rejected(b, 10) == "(accepted)");
  CHECK(rejected(b, 100) == "dx");
  // Without dW, x is not read (given or not): dx may take its place; without dx, W is not read:
  // dw may take its place. dy and saved may be overwritten too (only the BatchNorm passes read
  // them, and both GEMMs start after those end).
  b = t;
  b.dw = nullptr;
  b.dx = at(0x12000000);
  CHECK(rejected(b) == "(accepted)");
  b.x = nullptr;
  CHECK(rejected(b) == "(accepted)");
  b = t;
  b.dx = nullptr;
  b.dw = at(0x13000000);
  CHECK(rejected(b) == "(accepted)");
  b = t;
  b.dx = at(0x10000000);
  b.dw = at(0x11000000);
  CHECK(rejected(b) == "(accepted)");
  // Both GEMMs read da from the workspace.
  auto rejected_with_workspace = [&](const BackwardTensors& bt, std::uintptr_t ws) {
    try {
      validate_backward_tensors(p, bt, 0, at(ws), 0x100000);
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return std::string("(accepted)");
  };
  CHECK(rejected_with_workspace(t, 0x17000000) == "(accepted)");
  CHECK(rejected_with_workspace(t, 0x15000000 + 256) == "dx");
  CHECK(rejected_with_workspace(t, 0x16000000 - 0x100000 + 16) == "dw");
  // The passes write the workspace (partials, da) while they read dy and saved, and the copies
  // of x and W go there: an input inside it would be read overwritten.
  CHECK(rejected_with_workspace(t, 0x10000000 + 256) == "dy");
  CHECK(rejected_with_workspace(t, 0x11000000 - 0x100000 + 16) == "saved");
  CHECK(rejected_with_workspace(t, 0x12000000 + 512) == "x");
  CHECK(rejected_with_workspace(t, 0x13000000 + 512) == "w");
  b = t;
  b.dw = nullptr;  // x is not read: its place may be the workspace's
  CHECK(rejected_with_workspace(b, 0x12000000) == "(accepted)");
}

namespace {

// The argument validate_tensors names for `t`, or "(accepted)".
std::string forward_rejected(const Problem& p, const Tensors& t, std::int64_t rows = 0,
                             const void* workspace = nullptr, std::size_t workspace_bytes = 0) {
  try {
    validate_tensors(p, t, rows, workspace, workspace_bytes);
  } catch (const InvalidArgument& e) {
    return e.argument();
  }
  return "(accepted)";
}

}  // namespace

// The forward's run checks: y and saved are written while the GEMM reads x and W, and the
// workspace is written throughout. Addresses only, nothing is dereferenced.
TEST_CASE("forward tensors: y and saved must not overlap x, W, each other or the workspace") {
  const Problem p = parse_sweep_line("100x56x32 bf16 train").problem;  // ldx 32, ldy 56
  auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  Tensors t;
  t.x = at(0x10000000), t.w = at(0x11000000), t.y = at(0x12000000), t.saved = at(0x13000000);
  t.bias = at(0x14000000), t.scale = at(0x14001000);
  t.gamma = at(0x14002000), t.beta = at(0x14003000);
  auto rejected = [&](const Tensors& f, std::int64_t rows = 0, std::uintptr_t ws = 0,
                      std::size_t ws_bytes = 0) {
    return forward_rejected(p, f, rows, ws ? at(ws) : nullptr, ws_bytes);
  };
  const std::uintptr_t y_span = ((p.M - 1) * p.lda_y() + p.N) * 2;
  REQUIRE(rejected(t) == "(accepted)");
  REQUIRE(rejected(t, 0, 0x15000000, 0x10000) == "(accepted)");
  Tensors f = t;
  f.y = at(0x10000000);  // in place over x
  CHECK(rejected(f) == "y");
  f.y = at(0x11000000 + 64);  // inside W
  CHECK(rejected(f) == "y");
  f = t;
  f.saved = at(0x10000000 + 128);
  CHECK(rejected(f) == "saved");
  f.saved = at(0x12000000 + y_span - 16);  // over y's last eight elements (16-byte aligned)
  CHECK(rejected(f) == "saved");
  f.saved = at(0x12000000 + y_span);  // right after y
  CHECK(rejected(f) == "(accepted)");
  // Only the run's rows count.
  f = t;
  f.y = at(0x10000000 + 10 * p.lda_x() * 2);
  CHECK(rejected(f, 10) == "(accepted)");
  CHECK(rejected(f, 100) == "y");
  // The workspace meets each of the four.
  for (const auto& [base, arg] : {std::pair{0x10000000u, "x"}, std::pair{0x11000000u, "w"},
                                  std::pair{0x12000000u, "y"}, std::pair{0x13000000u, "saved"}}) {
    const std::string tensor = arg;  // CAPTURE's lambda cannot capture a structured binding
    CAPTURE(tensor);
    CHECK(rejected(t, 0, base + 256, 0x1000) == arg);
    CHECK(rejected(t, 0, base - 0x1000 + 2, 0x1000) == arg);
    CHECK(rejected(t, 0, base - 0x1000, 0x1000) == "(accepted)");
  }
  // Column slices of one buffer with one row stride share no byte: [x | y] rows of 88 elements,
  // and y and saved interleaved in rows of 112. Ranges would meet; the bytes do not.
  Problem q = p;
  q.ldx = q.ldy = 88;
  Tensors c = t;
  c.saved = nullptr;
  c.x = at(0x10000000);
  c.y = at(0x10000000 + 32 * 2);
  CHECK(forward_rejected(q, c) == "(accepted)");
  c.y = at(0x10000000 + 24 * 2);  // y from column 24: over x's last eight (16-byte aligned)
  CHECK(forward_rejected(q, c) == "y");
  c.y = at(0x10000000 + 88 * 2);  // y one row down: its row starts where x's second row does
  CHECK(forward_rejected(q, c) == "y");
  Problem r = p;
  r.ldy = 112;
  Tensors d = t;
  d.saved = at(0x12000000 + 56 * 2);
  CHECK(forward_rejected(r, d) == "(accepted)");
  d.saved = at(0x12000000 + 48 * 2);  // over y's last eight columns
  CHECK(forward_rejected(r, d) == "saved");
}

TEST_CASE("backward config keys parse back; bad text names the argument") {
  const Problem p = parse_sweep_line("300x72x40 bf16 train").problem;
  for (const Device& d : {Device::for_arch("sm_90a"), Device::for_arch("sm_80")}) {
    const BackwardConfig c = default_backward_config(p, d);
    CHECK(BackwardConfig::parse(c.key()).key() == c.key());
  }
  for (const char* bad : {"", "tiled.128x128x64.w2x2.s3.g8", "dx.tiled.128x128x64.w2x2.s3.g8",
                          "dx.tiled.fast.dw.tiled.128x128x64.w2x2.s3.g8"}) {
    CAPTURE(bad);
    try {
      BackwardConfig::parse(bad, "winner");
      FAIL("parsed");
    } catch (const InvalidArgument& e) {
      CHECK(e.argument() == "winner");
    }
  }
}

TEST_CASE(
    "autotune --backward's candidates: the heuristic's pair first, one GEMM varied at a time") {
  const Device hopper = Device::for_arch("sm_90a");
  // 512x2048x2048: an untuned plan moves the class's dX to cuBLASLt (plan_backward_config); that
  // pair is the one timed first, the class's dX tiles among dX's others.
  for (const char* line :
       {"1024x512x768 bf16 train", "300x72x40 fp32 eval", "512x2048x2048 bf16 train"}) {
    CAPTURE(std::string(line));
    const Problem p = parse_sweep_line(line).problem;
    const std::vector<BackwardConfig> cs = backward_tuning_configs(p, hopper);
    const BackwardConfig h = plan_backward_config(p, default_backward_config(p, hopper), hopper);
    REQUIRE(cs.size() > 2);
    CHECK(cs.front().key() == h.key());
    std::set<std::string> keys, dx, dw;
    for (const BackwardConfig& c : cs) {
      CAPTURE(c.key());
      CHECK(keys.insert(c.key()).second);  // no pair twice
      // Every pair keeps one of the heuristic's GEMMs and is one a BackwardPlan accepts.
      CHECK((c.dx_key() == h.dx_key() || c.dw_key() == h.dw_key()));
      CHECK(backward_config_why_invalid(p, c, hopper) == "");
      dx.insert(c.dx_key());
      dw.insert(c.dw_key());
    }
    // Both GEMMs' lists are searched, each with cuBLASLt: |dx| + |dw| - 1 pairs.
    CHECK(dx.size() > 1);
    CHECK(dw.size() > 1);
    CHECK(cs.size() == dx.size() + dw.size() - 1);
    CHECK(dx.count(std::string(kCublasLtGemmKey)) == 1);
    CHECK(dw.count(std::string(kCublasLtGemmKey)) == 1);
    CHECK(dx.size() == grad_gemm_candidates(p, backward_gemms(p).dx, false, hopper).size() + 1);
    CHECK(dw.size() == grad_gemm_candidates(p, backward_gemms(p).dw, true, hopper).size() + 1);
    const std::vector<KernelSource> sources = backward_tuning_sources(p, hopper);
    REQUIRE(sources.size() == cs.size());
    CHECK(sources.front().name == generate_backward(p, h).name);
  }
  Problem one = parse_sweep_line("2x64x64 bf16 train").problem;
  one.M = 1;  // train backward needs two rows
  CHECK_THROWS_AS(backward_tuning_configs(one, hopper), InvalidArgument);
}

// The per-column parameters, as run() checks them in both directions (require_param): one the
// problem has must be given and aligned to its dtype, one it lacks must be null, and the error
// names the argument. Addresses only, nothing is dereferenced.
TEST_CASE(
    "forward and backward tensors: per-column parameters present exactly when the problem "
    "has them") {
  auto at = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  for (const char* line : {"100x56x32 bf16 train", "100x56x32 bf16 train noscale noaffine"}) {
    CAPTURE(line);
    const Problem p = parse_sweep_line(line).problem;
    Tensors f;
    f.x = at(0x10000000), f.w = at(0x11000000), f.y = at(0x12000000);
    f.bias = at(0x13000000);
    if (p.has_scale) f.scale = at(0x13001000);
    if (p.has_affine) f.gamma = at(0x13002000), f.beta = at(0x13003000);
    f.save_mean = static_cast<float*>(at(0x13004000));
    f.save_invstd = static_cast<float*>(at(0x13005000));
    BackwardTensors b;
    b.dy = at(0x14000000), b.saved = at(0x15000000);
    b.scale = f.scale, b.gamma = f.gamma;
    b.save_mean = f.save_mean, b.save_invstd = f.save_invstd;
    auto forward = [&](const Tensors& t) { return forward_rejected(p, t); };
    auto backward = [&](const BackwardTensors& t) -> std::string {
      try {
        validate_backward_tensors(p, t, 0);
      } catch (const InvalidArgument& e) {
        return e.argument();
      }
      return "(accepted)";
    };
    REQUIRE(forward(f) == "(accepted)");
    REQUIRE(backward(b) == "(accepted)");
    Tensors g = f;
    g.scale = p.has_scale ? nullptr : at(0x13001000);
    CHECK(forward(g) == "scale");
    g = f;
    g.gamma = p.has_affine ? at(0x13002002) /* misaligned */ : at(0x13002000);
    CHECK(forward(g) == "gamma");
    BackwardTensors c = b;
    c.scale = p.has_scale ? nullptr : at(0x13001000);
    CHECK(backward(c) == "scale");
    c = b;
    c.gamma = p.has_affine ? at(0x13002002) : at(0x13002000);
    CHECK(backward(c) == "gamma");
  }
}
