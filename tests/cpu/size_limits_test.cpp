// Sizes are validated where they are born: at the largest M, N, K and row strides
// Problem::validate accepts, and at the largest tile counts KernelConfig::why_invalid accepts,
// the kernels compile for sm_80 and sm_90a without a word from NVRTC (its "integer operation
// result is out of range" is a warning, so a tile count that overflowed used to compile); one
// more is refused with an InvalidArgument naming the argument, or a reason naming the count.
#include <doctest/doctest.h>

#include "test_problem.hpp"

#include <spdlog/sinks/ostream_sink.h>

#include <atomic>
#include <future>
#include <limits>
#include <sstream>
#include <vector>

#include "fusejit/codegen/codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fusejit/util/log.hpp"

using namespace fusejit;

namespace {

constexpr std::int64_t kMaxStride = std::numeric_limits<std::int32_t>::max();

Problem problem(DType d, Mode m, std::int64_t M, std::int64_t N, std::int64_t K) {
  Problem p;
  p.M = M, p.N = N, p.K = K, p.dtype = d, p.mode = m;
  return p;
}

using fusejit::test::rejected_argument;

struct Job {
  Problem problem;
  KernelConfig config;
};

// Compiles the jobs for `arch` (two at a time) with fusejit's logger at debug level, where
// compile() logs NVRTC's log of a successful compile, and returns what NVRTC said: compile
// errors and those logs (each names its kernel). Empty when it said nothing.
std::string nvrtc_words(const std::vector<Job>& jobs, const std::string& arch) {
  std::ostringstream said;
  auto logger = fusejit::log();
  const auto level = logger->level();
  // Process-wide, but only this test's compile threads log while it is in place.
  logger->sinks().push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(said));
  logger->set_level(spdlog::level::debug);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    std::string errors;
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      try {
        compile(generate(jobs[i].problem, jobs[i].config), arch);
      } catch (const CompileError& e) {
        errors += e.what() + std::string("\n");
      }
    }
    return errors;
  };
  auto other = std::async(std::launch::async, work);
  std::string out = work();
  out += other.get();
  logger->set_level(level);
  logger->sinks().pop_back();
  const std::string text = said.str();
  for (auto at = text.find("NVRTC log for"); at != std::string::npos;
       at = text.find("NVRTC log for", at + 1))
    out += text.substr(at, text.find("NVRTC log for", at + 1) - at);
  return out;
}

// Every config the planner would pick for `p` on `arch`: the tiled one, and warpspec's where it
// can run.
std::vector<KernelConfig> picks(const Problem& p, const Device& dev) {
  std::vector<KernelConfig> out;
  for (Variant v : {Variant::tiled, Variant::warpspec}) {
    try {
      out.push_back(default_config(p, dev, v));
    } catch (const InvalidArgument&) {
      // This variant cannot run here (warpspec off sm_90a or for fp32): config_test checks that.
    }
  }
  return out;
}

}  // namespace

TEST_CASE("each size is accepted up to its limit and refused one past it, naming the argument") {
  CHECK(kMaxDim == (std::int64_t{1} << 31) - 257);
  for (DType d : {DType::fp32, DType::bf16}) {
    CAPTURE(name(d));
    // M, N and K: kMaxDim in either mode (train's BatchNorm apply pass has a one-dimensional
    // grid: on grid.y, 65535 blocks of 64 rows would cap M at 4194240).
    CHECK(rejected_argument(problem(d, Mode::train, kMaxDim, 64, 64)) == "(accepted)");
    CHECK(rejected_argument(problem(d, Mode::eval, kMaxDim, 64, 64)) == "(accepted)");
    CHECK(rejected_argument(problem(d, Mode::eval, kMaxDim + 1, 64, 64)) == "M");
    CHECK(rejected_argument(problem(d, Mode::train, 2, kMaxDim, 64)) == "(accepted)");
    CHECK(rejected_argument(problem(d, Mode::train, 2, kMaxDim + 1, 64)) == "N");
    CHECK(rejected_argument(problem(d, Mode::train, 2, 64, kMaxDim)) == "(accepted)");
    CHECK(rejected_argument(problem(d, Mode::train, 2, 64, kMaxDim + 1)) == "K");
    // Row strides: up to 2^31 - 1 (int in the kernels, every offset from them 64-bit).
    for (const char* arg : {"ldx", "ldw", "ldy"}) {
      CAPTURE(arg);
      for (const std::int64_t ld : {kMaxStride, kMaxStride + 1}) {
        Problem p = problem(d, Mode::eval, 100, 64, 64);
        (std::string(arg) == "ldx" ? p.ldx : std::string(arg) == "ldw" ? p.ldw : p.ldy) = ld;
        CHECK(rejected_argument(p) == (ld == kMaxStride ? "(accepted)" : arg));
      }
    }
  }
  // The shape text has the same bounds, with one line naming "shape".
  CHECK(parse_shape("2x64x2147483391").K == kMaxDim);
  for (const char* bad : {"2x64x2147483392", "2x2147483600x1", "2x64x2147483647"}) {
    CAPTURE(bad);
    try {
      parse_shape(bad);
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      CHECK(e.argument() == "shape");
      CHECK(std::string(e.what()).find("is above 2147483391") != std::string::npos);
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("at the largest accepted sizes the planner's kernels compile without NVRTC warnings") {
  // Each limit on its own, with tails everywhere else; train where M allows it. ld* at 2^31 - 1.
  std::vector<Problem> edge;
  for (DType d : {DType::fp32, DType::bf16}) {
    edge.push_back(problem(d, Mode::eval, kMaxDim, 72, 40));
    // Odd sizes, with padded rows so that warpspec (16-byte rows) can run them too.
    Problem wide = problem(d, Mode::train, 2, kMaxDim, 8);
    wide.ldy = kMaxDim + 1;
    edge.push_back(wide);
    Problem deep = problem(d, Mode::train, 3, 64, kMaxDim);
    deep.ldx = deep.ldw = kMaxDim + 1;
    edge.push_back(deep);
    edge.push_back(problem(d, Mode::train, kMaxDim, 200, 64));  // 33554428 apply slabs
    Problem strided = problem(d, Mode::train, 1000, 200, 72);
    strided.ldx = strided.ldw = strided.ldy = kMaxStride;
    edge.push_back(strided);
  }
  std::size_t compiled = 0;
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    const Device dev = Device::for_arch(arch);
    std::vector<Job> jobs;
    for (const Problem& p : edge) {
      REQUIRE(rejected_argument(p) == "(accepted)");
      for (const KernelConfig& c : picks(p, dev)) jobs.push_back({p, c});
    }
    CAPTURE(arch);
    CHECK(nvrtc_words(jobs, arch) == "");
    compiled += jobs.size();
  }
  CHECK(compiled >= 24);
}

TEST_CASE("32-bit tile counts: the largest accepted compiles, one more row or column is refused") {
  struct Edge {
    std::string arch;
    const char* config;
    Problem largest;      // the largest M (or N) whose count fits
    bool grow_n;          // the next one adds a column instead of a row
    const char* refusal;  // what why_invalid names for the next one
  };
  const std::int64_t m_edge = 2082408384;  // 65075262 row tiles of 32, 32537631 of 64
  auto deep_k = [](std::int64_t M) {
    Problem p = problem(DType::bf16, Mode::eval, M, 256, kMaxDim);
    p.ldx = p.ldw = kMaxDim + 1;  // 16-byte rows for TMA
    return p;
  };
  const Edge edges[] = {
      // 65075262 x 33 = 2^31 - 2 tiles (GroupedRaster::kTiles); one more row tile passes 2^31.
      {"sm_80", "tiled.32x64x32.w1x2.s3.g8", problem(DType::bf16, Mode::eval, m_edge, 33 * 64, 40),
       false, "row tiles x column tiles"},
      {"sm_90a", "tiled.32x64x32.w1x2.s3.g8", problem(DType::bf16, Mode::eval, m_edge, 33 * 64, 40),
       false, "row tiles x column tiles"},
      // GROUP_M x column tiles: 16 x 134217727 = 2^31 - 16; one more column tile is 2^31.
      {"sm_80", "tiled.16x8x32.w1x1.s3.g16",
       problem(DType::bf16, Mode::eval, 16, std::int64_t{134217727} * 8, 40), true,
       "group_m x column tiles"},
      // warpspec: 2 x (32537631 x 33) = 2^31 - 2; one more row tile passes 2^31.
      {"sm_90a", "warpspec.64x64x64.c1.s4.g8.cl1.p0",
       problem(DType::bf16, Mode::eval, m_edge, 33 * 64, 40), false, "2 x cluster tiles"},
      // Persistent on 132 SMs with K = kMaxDim (33554428 k tiles of 64): 16896 tiles are 128
      // per CTA, 128 x 33554428 k slices < 2^32; 16897 tiles make it 129 per CTA.
      {"sm_90a", "warpspec.128x256x64.c2.s4.g8.cl1.p1", deep_k(16896 * 128), false,
       "k slices per persistent CTA"},
  };
  for (const Edge& e : edges) {
    const Device dev = Device::for_arch(e.arch);
    const KernelConfig c = KernelConfig::parse(e.config);
    CAPTURE(e.arch);
    CAPTURE(e.config);
    CAPTURE(e.largest.key());
    REQUIRE(rejected_argument(e.largest) == "(accepted)");
    CHECK(c.why_invalid(e.largest, dev) == "");
    CHECK(nvrtc_words({{e.largest, c}}, e.arch) == "");
    Problem next = e.largest;
    (e.grow_n ? next.N : next.M) += 1;
    REQUIRE(rejected_argument(next) == "(accepted)");
    CHECK(c.why_invalid(next, dev).find(e.refusal) != std::string::npos);
  }
  // BatchNorm apply blocks (two-pass train): 33038209 slabs of 64 rows x 65 strips of 32
  // columns (2-byte alignment: one bf16 per thread) = 2^31 - 63; one more slab passes 2^31.
  {
    Problem largest = problem(DType::bf16, Mode::train, std::int64_t{33038209} * 64, 65 * 32, 40);
    largest.alignment = 2;
    const KernelConfig c = KernelConfig::parse("tiled.64x64x64.w2x2.s3.g8");
    const Device a100 = Device::for_arch("sm_80");
    REQUIRE(rejected_argument(largest) == "(accepted)");
    CHECK(c.why_invalid(largest, a100) == "");
    CHECK(nvrtc_words({{largest, c}}, "sm_80") == "");
    Problem next = largest;
    next.M += 1;
    REQUIRE(rejected_argument(next) == "(accepted)");
    CHECK(c.why_invalid(next, a100).find("BatchNorm apply blocks") != std::string::npos);
    next.mode = Mode::eval;  // no apply pass
    CHECK(c.why_invalid(next, a100) == "");
  }
  // The slice count is a persistent CTA's: the one-tile-per-CTA twin runs that problem.
  Problem many = edges[4].largest;
  many.M += 1;
  CHECK(KernelConfig::parse("warpspec.128x256x64.c2.s4.g8.cl1.p0")
            .why_invalid(many, Device::for_arch("sm_90a")) == "");
}
