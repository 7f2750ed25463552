// The sweep's GPU-free parts: the built-in case lists cover what they promise, the sweep-file
// syntax round-trips and reports bad lines, inputs are what the reference sees, error figures,
// and the check/bench verbs' argument handling.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "test_process.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "fusejit/error.hpp"
#include "fusejit/verify/cpu_reference.hpp"
#include "fusejit/verify/host_tensor.hpp"
#include "tools/sweep.hpp"

using namespace fusejit;

namespace {

using CliResult = fusejit::test::CommandResult;
using fusejit::test::run_cli;

template <class T>
bool contains(const std::set<T>& s, T v) {
  return s.count(v) != 0;
}

}  // namespace

TEST_CASE("quick sweep: every listed M, N and K value, both distributions, varied flags") {
  for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
    for (Mode m : {Mode::train, Mode::eval}) {
      CAPTURE(name(d));
      CAPTURE(name(m));
      const auto cases = builtin_sweep(false, d, m);
      CHECK(cases.size() >= 40);
      CHECK(cases.size() <= 60);
      std::set<std::int64_t> Ms, Ns, Ks;
      std::set<Distribution> dists;
      int no_bias = 0, no_scale = 0, no_affine = 0, cumulative = 0, strided = 0, odd = 0,
          notrack = 0, same_params = 0, low_align = 0;
      for (const auto& c : cases) {
        const Problem& p = c.problem;
        CHECK(p.dtype == d);
        CHECK(p.mode == m);
        CHECK_NOTHROW(p.validate());
        Ms.insert(p.M);
        Ns.insert(p.N);
        Ks.insert(p.K);
        dists.insert(c.distribution);
        no_bias += !p.has_bias;
        no_scale += !p.has_scale;
        no_affine += !p.has_affine;
        cumulative += !p.momentum;
        strided += p.ldx > p.K;
        odd += p.ldx % 2 == 1 && p.ldx > p.K && p.ldy % 2 == 1 &&
               p.alignment == static_cast<int>(storage_bytes(d));
        notrack += !c.track_running_stats;
        same_params += p.param_dtype != DType::fp32;
        low_align += p.alignment < 16;
      }
      for (std::int64_t v : {2, 3, 17, 64, 127, 128, 129, 1000}) CHECK(contains(Ms, v));
      for (std::int64_t v : {1, 7, 8, 64, 200, 512}) CHECK(contains(Ns, v));
      for (std::int64_t v : {1, 5, 8, 64, 1000}) CHECK(contains(Ks, v));
      if (m == Mode::eval) CHECK(contains(Ms, std::int64_t{1}));
      CHECK(dists.size() == 2);
      CHECK(no_bias > 0);
      CHECK(no_scale > 0);
      CHECK(no_affine > 0);
      CHECK(cumulative > 0);
      CHECK(strided > 0);
      CHECK(odd > 0);
      CHECK(low_align > 0);
      if (m == Mode::train) CHECK(notrack > 0);
      if (storage_bytes(d) == 2) CHECK(same_params > 0);
      // The list is fixed: the same on every call.
      const auto again = builtin_sweep(false, d, m);
      REQUIRE(again.size() == cases.size());
      for (std::size_t i = 0; i < cases.size(); ++i) CHECK(again[i].text() == cases[i].text());
    }
  }
  const auto full = builtin_sweep(true, DType::bf16, Mode::train);
  std::set<std::int64_t> Ms, Ns, Ks;
  for (const auto& c : full) {
    Ms.insert(c.problem.M);
    Ns.insert(c.problem.N);
    Ks.insert(c.problem.K);
  }
  CHECK(full.size() > builtin_sweep(false, DType::bf16, Mode::train).size());
  CHECK(contains(Ms, std::int64_t{1024}));
  CHECK(contains(Ms, std::int64_t{4096}));
  CHECK(contains(Ns, std::int64_t{4096}));
  CHECK(contains(Ks, std::int64_t{4096}));
}

TEST_CASE("sweep lines round-trip through text() and reject bad tokens") {
  for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16})
    for (Mode m : {Mode::train, Mode::eval})
      for (const auto& c : builtin_sweep(true, d, m)) {
        const SweepCase back = parse_sweep_line(c.text());
        CHECK(back.text() == c.text());
        CHECK(back.problem.key() == c.problem.key());
        CHECK(back.distribution == c.distribution);
        CHECK(back.track_running_stats == c.track_running_stats);
      }
  const SweepCase c = parse_sweep_line(
      "  1000x200x64 bf16 train same noscale momentum=none ldx=72 non_centred notrack # comment");
  CHECK(c.problem.M == 1000);
  CHECK(c.problem.N == 200);
  CHECK(c.problem.K == 64);
  CHECK(c.problem.param_dtype == DType::bf16);
  CHECK(!c.problem.has_scale);
  CHECK(c.problem.has_bias);
  CHECK(!c.problem.momentum);
  CHECK(c.problem.ldx == 72);
  CHECK(c.problem.alignment == 16);
  CHECK(c.distribution == Distribution::non_centred);
  CHECK(!c.track_running_stats);
  CHECK(parse_sweep_line("17x7x5 fp16 eval").problem.alignment == 2);  // 10-byte rows
  CHECK(parse_sweep_line("64x64x64 fp32 eval align=4").problem.alignment == 4);
  CHECK(parse_sweep_line("64x64x64 fp32 train eps=0.001 momentum=0.5").problem.eps == 1e-3);

  auto arg_of = [](const char* line) {
    try {
      parse_sweep_line(line);
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return std::string("(no error)");
  };
  CHECK(arg_of("64x64 bf16 train") == "shape");
  CHECK(arg_of("64x64x64 bf64 train") == "dtype");
  CHECK(arg_of("64x64x64 bf16 infer") == "mode");
  CHECK(arg_of("64x64x64 bf16") == "sweep");
  CHECK(arg_of("64x64x64 bf16 train nobais") == "sweep");
  CHECK(arg_of("64x64x64 bf16 train ldx=abc") == "sweep");
  CHECK(arg_of("64x64x64 bf16 train ldx=60") == "ldx");
  CHECK(arg_of("1x64x64 bf16 train") == "M");
  CHECK(arg_of("64x64x64 fp16 train bf16") == "param_dtype");
  CHECK(arg_of("64x64x5 bf16 train align=16") == "sweep");  // 10-byte rows cannot promise 16
}

TEST_CASE("sweep files: comments and blank lines, dtype/mode filter, errors name the line") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("fusejit-sweep-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto good = (dir / "good.txt").string();
  {
    std::ofstream f(good);
    f << "# shapes users ask about\n\n128x512x1024 bf16 train\n128x512x1024 bf16 eval same\n"
         "   \n33x65x17 fp32 train nobias # odd\n";
  }
  const auto all = read_sweep_file(good);
  REQUIRE(all.size() == 3);
  CHECK(all[2].problem.K == 17);
  CHECK(!all[2].problem.has_bias);
  CHECK(sweep_cases(good, {DType::bf16}, {Mode::train, Mode::eval}).size() == 2);
  CHECK(sweep_cases(good, {DType::fp32, DType::bf16}, {Mode::train}).size() == 2);
  CHECK(sweep_cases("quick", {DType::fp16}, {Mode::eval}).size() ==
        builtin_sweep(false, DType::fp16, Mode::eval).size());
  const auto bad = (dir / "bad.txt").string();
  {
    std::ofstream f(bad);
    f << "128x512x1024 bf16 train\n# fine\n128x512x1024 bf16 train frobnicate\n";
  }
  try {
    read_sweep_file(bad);
    FAIL("a bad flag must throw");
  } catch (const InvalidArgument& e) {
    CHECK(e.argument() == "sweep");
    CHECK(std::string(e.what()).find("bad.txt:3") != std::string::npos);
    CHECK(std::string(e.what()).find("frobnicate") != std::string::npos);
  }
  CHECK_THROWS_AS(read_sweep_file((dir / "missing.txt").string()), InvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST_CASE("case inputs: NaN in the stride padding only, what the reference sees, no zeros") {
  const SweepCase c = parse_sweep_line("5x3x4 bf16 train ldx=7 ldw=6 ldy=9 non_centred");
  const CaseInputs in = make_case_inputs(c, 99);
  CHECK(in.seed == 99);
  CHECK(in.x.size() == 5 * 7);
  CHECK(in.w.size() == 3 * 6);
  for (std::size_t r = 0; r < 5; ++r)
    for (std::size_t k = 0; k < 7; ++k) {
      const float v = in.x.get(r * 7 + k);
      if (k < 4) {
        CHECK(v != 0.0f);
        CHECK(v >= 0.0f);
      } else {
        CHECK(std::isnan(v));
      }
    }
  const ReferenceInputs ref = reference_inputs(in);
  CHECK(ref.x.size() == 20);
  CHECK(ref.w.size() == 12);
  for (double v : ref.x) CHECK(std::isfinite(v));
  for (double v : ref.w) CHECK(std::isfinite(v));
  CHECK(ref.x[4] == static_cast<double>(in.x.get(7)));  // row 1 starts at element ldx
  CHECK(ref.running_var.size() == 3);
  for (double v : ref.running_var) CHECK(v > 0);
  for (double v : ref.scale) CHECK(v != 0);
  CHECK(in.count_batches());
  const CaseInputs again = make_case_inputs(c, 99);
  CHECK(again.x.to_doubles().size() == in.x.to_doubles().size());
  CHECK(reference_inputs(again).x == ref.x);
  CHECK(reference_inputs(make_case_inputs(c)).x != ref.x);

  const SweepCase bare = parse_sweep_line("4x3x2 fp16 train nobias noscale noaffine notrack");
  const CaseInputs b = make_case_inputs(bare, 1);
  CHECK(b.bias.empty());
  CHECK(b.scale.empty());
  CHECK(b.gamma.empty());
  CHECK(b.running_mean.empty());
  CHECK(!b.count_batches());
  const CaseInputs cum =
      make_case_inputs(parse_sweep_line("4x3x2 fp16 train notrack momentum=none"), 1);
  CHECK(cum.count_batches());  // cumulative momentum needs the counter even untracked
  CHECK(!make_case_inputs(parse_sweep_line("4x3x2 fp16 eval"), 1).count_batches());
}

TEST_CASE("case inputs: tf32's operands as the implementation reads them, other dtypes as stored") {
  // The case the reference op's tf32 sweep failed against rounded operands on an H200 (y 2.16e-3
  // against 2e-3): its cuBLASLt GEMM matched the whole operands. The three readings differ.
  const CaseInputs in = make_case_inputs(
      parse_sweep_line("3x1x1 tf32 train fp32 nobias non_centred"), 0x1715222c6c7b3cd3ull);
  const ReferenceInputs whole = reference_inputs(in, Tf32Operands::whole);
  const ReferenceInputs rounded = reference_inputs(in);
  const ReferenceInputs truncated = reference_inputs(in, Tf32Operands::truncated);
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(whole.x[i] == static_cast<double>(in.x.get(i)));
    CHECK(rounded.x[i] == static_cast<double>(round_to_tf32(in.x.get(i))));
    CHECK(truncated.x[i] == static_cast<double>(truncate_to_tf32(in.x.get(i))));
  }
  CHECK(truncated.w[0] == static_cast<double>(truncate_to_tf32(in.w.get(0))));
  CHECK(whole.x != rounded.x);
  CHECK(truncated.x != rounded.x);
  const ReferenceSettings s = reference_settings(in.c.problem, in.num_batches_tracked);
  const double apart =
      relative_error(reference_forward(whole, s).y, reference_forward(rounded, s).y);
  CHECK(apart > sweep_threshold(DType::tf32));  // why the reference op needs its own readings
  // And one where its kernel rounded them (2x7x8, H200): there the whole operands' save_invstd
  // is as far from the rounded ones'.
  const CaseInputs two =
      make_case_inputs(parse_sweep_line("2x7x8 tf32 train fp32"), 0xd9fec64e9f9fc8c8ull);
  const ReferenceSettings s2 = reference_settings(two.c.problem, two.num_batches_tracked);
  CHECK(
      relative_error(reference_forward(reference_inputs(two, Tf32Operands::whole), s2).save_invstd,
                     reference_forward(reference_inputs(two), s2).save_invstd) >
      sweep_threshold(DType::tf32));
  // fp16 stores what it multiplies: every reading is the stored value.
  const CaseInputs h = make_case_inputs(parse_sweep_line("3x2x5 fp16 train"), 7);
  CHECK(reference_inputs(h, Tf32Operands::truncated).x == reference_inputs(h).x);
  CHECK(reference_inputs(h, Tf32Operands::whole).w == reference_inputs(h).w);
}

TEST_CASE("relative error and thresholds") {
  CHECK(relative_error({1, 2, 3}, {1, 2, 3}) == 0);
  CHECK(relative_error({3, 4}, {0, 0}) == doctest::Approx(5));
  CHECK(relative_error({1.1, 2}, {1, 2}) == doctest::Approx(0.1 / std::sqrt(5.0)));
  CHECK(std::isinf(relative_error({NAN, 2}, {1, 2})));
  CHECK(std::isinf(relative_error({INFINITY, 2}, {1, 2})));
  CHECK(std::isinf(relative_error({1}, {1, 2})));
  CHECK(sweep_threshold(DType::fp32) == 2e-5);
  CHECK(sweep_threshold(DType::tf32) == 2e-3);
  CHECK(sweep_threshold(DType::fp16) == 1e-2);
  CHECK(sweep_threshold(DType::bf16) == 1e-2);
}

TEST_CASE("compare flags NaN, a wrong counter and a written padding") {
  const SweepCase c = parse_sweep_line("3x2x2 fp32 train");
  const CaseInputs in = make_case_inputs(c, 5);
  const ReferenceOutputs ref = reference_forward(
      reference_inputs(in), reference_settings(c.problem, in.num_batches_tracked));
  CaseOutputs got;
  got.y = ref.y;
  got.running_mean = ref.running_mean;
  got.running_var = ref.running_var;
  got.save_mean = ref.save_mean;
  got.save_invstd = ref.save_invstd;
  got.num_batches_tracked = in.num_batches_tracked + 1;
  CaseErrors e = compare(in, got, ref);
  CHECK(e.worst() == 0);
  CHECK(!e.non_finite);
  CHECK(e.counter_ok);
  got.num_batches_tracked = in.num_batches_tracked;
  CHECK(!compare(in, got, ref).counter_ok);
  got.num_batches_tracked = in.num_batches_tracked + 1;
  got.save_invstd[1] = NAN;
  e = compare(in, got, ref);
  CHECK(e.non_finite);
  CHECK(std::isinf(e.worst()));
  got.save_invstd = ref.save_invstd;
  got.running_var[0] *= 1.001;
  e = compare(in, got, ref);
  CHECK(e.running_var > 1e-4);
  CHECK(e.worst() == e.running_var);
  CHECK(compare(in, got, ref).stats_kept);  // train moves them by design
  got.y_padding_intact = false;
  CHECK(!compare(in, got, ref).padding_ok);

  const SweepCase ce = parse_sweep_line("3x2x2 bf16 eval same");
  const CaseInputs ie = make_case_inputs(ce, 6);
  const ReferenceOutputs re =
      reference_forward(reference_inputs(ie), reference_settings(ce.problem));
  CaseOutputs ge;
  ge.y = re.y;
  ge.running_mean = re.running_mean;
  ge.running_var = re.running_var;
  CHECK(compare(ie, ge, re).stats_kept);
  CHECK(compare(ie, ge, re).worst() == 0);
  ge.running_var[1] = std::nextafter(ge.running_var[1], 10.0);
  CHECK(!compare(ie, ge, re).stats_kept);
}

TEST_CASE("fusejit check/bench: case listing without a GPU, argument errors exit 2") {
  CliResult r = run_cli("check --list --sweep quick --dtypes bf16 --modes train");
  CHECK(r.code == 0);
  const auto n = builtin_sweep(false, DType::bf16, Mode::train).size();
  CHECK(r.out.find("# " + std::to_string(n) + " cases") != std::string::npos);
  CHECK(r.out.find(builtin_sweep(false, DType::bf16, Mode::train)[5].text()) != std::string::npos);
  r = run_cli("check --list --dtypes bf64");
  CHECK(r.code == 2);
  CHECK(r.out.find("dtype") != std::string::npos);
  r = run_cli("check --list --modes infer");
  CHECK(r.code == 2);
  r = run_cli("check --list --variant fast");
  CHECK(r.code == 2);
  CHECK(r.out.find("variant") != std::string::npos);
  r = run_cli("check --list --op reference --variant tiled");
  CHECK(r.code == 2);
  r = run_cli("check --list --sweep /nonexistent/sweep.txt");
  CHECK(r.code == 2);
  CHECK(r.out.find("sweep") != std::string::npos);
  r = run_cli("check --list --seed xyz");
  CHECK(r.code == 2);
  r = run_cli("bench --runs 10");
  CHECK(r.code == 2);
  r = run_cli("bench --shape 12x34 --runs 50");
  CHECK(r.code == 2);
  CHECK(r.out.find("shape") != std::string::npos);
  r = run_cli("bench --variant fast");
  CHECK(r.code == 2);
}
