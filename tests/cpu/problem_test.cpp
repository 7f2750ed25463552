#include <doctest/doctest.h>

#include "test_problem.hpp"

#include "fusejit/error.hpp"
#include "fusejit/problem.hpp"

using namespace fusejit;

namespace {

Problem base() {
  Problem p;
  p.M = 64, p.N = 80, p.K = 96;
  return p;
}

using fusejit::test::rejected_argument;

}  // namespace

TEST_CASE("shapes parse as MxNxK and reject everything else") {
  const Shape s = parse_shape("1024x8192x4096");
  CHECK(s.M == 1024);
  CHECK(s.N == 8192);
  CHECK(s.K == 4096);
  CHECK(format_shape(s) == "1024x8192x4096");
  for (const char* bad : {"", "1024", "1x2", "1x2x", "x2x3", "1x2x3x4", "0x2x3", "-1x2x3", "1x2x3 ",
                          "ax2x3", "1x2x99999999999", "1.5x2x3"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_shape(bad), InvalidArgument);
  }
}

TEST_CASE("validation names the offending argument") {
  CHECK(rejected_argument(base()) == "(accepted)");
  auto with = [](auto edit) {
    Problem p = base();
    edit(p);
    return rejected_argument(p);
  };
  CHECK(with([](Problem& p) { p.M = 0; }) == "M");
  CHECK(with([](Problem& p) { p.N = -3; }) == "N");
  CHECK(with([](Problem& p) { p.K = 0; }) == "K");
  CHECK(with([](Problem& p) { p.M = 1; }) == "M");  // train mode needs 2 rows
  CHECK(with([](Problem& p) { p.M = 1, p.mode = Mode::eval; }) == "(accepted)");
  CHECK(with([](Problem& p) { p.ldx = 95; }) == "ldx");
  CHECK(with([](Problem& p) { p.ldw = 10; }) == "ldw");
  CHECK(with([](Problem& p) { p.ldy = 79; }) == "ldy");
  CHECK(with([](Problem& p) { p.eps = 0; }) == "eps");
  CHECK(with([](Problem& p) { p.momentum = 1.5; }) == "momentum");
  CHECK(with([](Problem& p) { p.momentum = std::nullopt; }) == "(accepted)");
  CHECK(with([](Problem& p) { p.param_dtype = DType::fp16; }) == "param_dtype");  // x is bf16
  CHECK(with([](Problem& p) { p.param_dtype = DType::bf16; }) == "(accepted)");
  CHECK(with([](Problem& p) { p.alignment = 3; }) == "alignment");
  CHECK(with([](Problem& p) { p.dtype = DType::fp32, p.alignment = 2; }) == "alignment");
  // 16-byte alignment needs row strides that are multiples of 16 bytes (8 bf16 elements).
  CHECK(with([](Problem& p) { p.K = 5, p.alignment = 16; }) == "ldx");
  CHECK(with([](Problem& p) { p.K = 5, p.alignment = 2; }) == "(accepted)");
  CHECK(with([](Problem& p) { p.K = 5; }) == "(accepted)");  // automatic: what the strides allow
}

TEST_CASE("the key names every field that changes kernels or results") {
  const std::string k = base().key();
  auto differs = [&](auto edit) {
    Problem p = base();
    edit(p);
    return p.key() != k;
  };
  CHECK(base().key() == k);
  CHECK(differs([](Problem& p) { p.M = 65; }));
  CHECK(differs([](Problem& p) { p.N = 81; }));
  CHECK(differs([](Problem& p) { p.K = 97; }));
  CHECK(differs([](Problem& p) { p.dtype = DType::fp16; }));
  CHECK(differs([](Problem& p) { p.param_dtype = DType::bf16; }));
  CHECK(differs([](Problem& p) { p.mode = Mode::eval; }));
  CHECK(differs([](Problem& p) { p.eps = 1e-3; }));
  CHECK(differs([](Problem& p) { p.momentum = 0.2; }));
  CHECK(differs([](Problem& p) { p.momentum = std::nullopt; }));
  CHECK(differs([](Problem& p) { p.has_bias = false; }));
  CHECK(differs([](Problem& p) { p.has_scale = false; }));
  CHECK(differs([](Problem& p) { p.has_affine = false; }));
  CHECK(differs([](Problem& p) { p.ldx = 104; }));
  CHECK(differs([](Problem& p) { p.alignment = 8; }));
  // Automatic alignment and the same alignment spelled out are the same problem.
  CHECK(!differs([](Problem& p) { p.alignment = 16; }));
  // Packed and explicit leading dimensions describe the same memory, so they share a key.
  CHECK(!differs([](Problem& p) { p.ldx = p.K; }));
}

TEST_CASE("automatic alignment is the widest every row stride allows") {
  Problem p = base();
  CHECK(p.effective_alignment() == 16);
  p.K = 5;  // bf16 rows of x and W are 10 bytes
  CHECK(p.effective_alignment() == 2);
  p.dtype = DType::fp32;  // 20 bytes
  CHECK(p.effective_alignment() == 4);
  p.K = 96, p.ldy = 82;  // y rows of 328 bytes
  CHECK(p.effective_alignment() == 8);
  p.alignment = 4;
  CHECK(p.effective_alignment() == 4);
}

TEST_CASE("natural alignment is the widest the pointer and stride share") {
  CHECK(natural_alignment(0x1000, 64) == 16);
  CHECK(natural_alignment(0x1008, 64) == 8);
  CHECK(natural_alignment(0x1000, 20) == 4);
  CHECK(natural_alignment(0x1002, 64) == 2);
  CHECK(natural_alignment(0x1001, 64) == 1);
}

TEST_CASE("parse errors print control characters escaped, on one line") {
  const std::string evil = "2x\x1b[31m3\nx4\x7f\\";
  for (auto parse : {+[](const std::string& t) { parse_shape(t); },
                     +[](const std::string& t) { parse_dtype(t); },
                     +[](const std::string& t) { parse_mode(t); }}) {
    try {
      parse(evil);
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      CHECK(what.find("2x\\x1b[31m3\\x0ax4\\x7f\\\\") != std::string::npos);
      for (const char c : what) CHECK((c >= 0x20 && c < 0x7f));
    }
  }
  CHECK(printable("plain 1024x8192x8192") == "plain 1024x8192x8192");
  CHECK(printable(std::string("a\0b\xc3\xa9", 5)) == "a\\x00b\\xc3\\xa9");
}
