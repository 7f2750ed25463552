#include "fusejit/verify/verification.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "fusejit/device.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/reference/cublaslt_reference.hpp"
#include "fusejit/util/durable_file.hpp"

namespace fusejit {

namespace {

constexpr double kDefaultMomentum = 0.1;
constexpr double kDefaultEps = 1e-5;

std::vector<std::string_view> tokens(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    std::size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string_view strip_comment(std::string_view line) {
  const auto hash = line.find('#');
  return hash == std::string_view::npos ? line : line.substr(0, hash);
}

std::int64_t parse_int(std::string_view flag, std::string_view v) {
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || v.empty())
    throw InvalidArgument("sweep", fmt::format("{}: expected an integer; got '{}'", flag, v));
  return out;
}

double parse_double(std::string_view flag, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double out = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0')
    throw InvalidArgument("sweep", fmt::format("{}: expected a number; got '{}'", flag, v));
  return out;
}

bool is_dtype_name(std::string_view s) {
  return s == "fp32" || s == "tf32" || s == "fp16" || s == "bf16" || s == "same";
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Independent streams for a case's tensors from one case seed.
std::uint64_t sub_seed(std::uint64_t seed, std::uint64_t k) {
  return splitmix64(seed ^ (k << 56) ^ k);
}

void poison_padding(HostTensor& t, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  const float nan = std::nanf("");
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = cols; c < ld; ++c) t.set(static_cast<std::size_t>(r * ld + c), nan);
}

HostTensor param_tensor(const Problem& p, bool present) {
  return present ? HostTensor(p.param_dtype, static_cast<std::size_t>(p.N)) : HostTensor();
}

void upload(DeviceBuffer& b, const HostTensor& h) {
  if (!h.empty()) b.upload(h.data(), h.bytes());
}

DeviceBuffer alloc_like(const HostTensor& h) {
  return h.empty() ? DeviceBuffer() : DeviceBuffer(h.bytes());
}

std::vector<double> download_param(const DeviceBuffer& b, DType dtype, std::int64_t n) {
  return download_packed(b, dtype, 1, n, n);
}

std::vector<double> download_floats(const DeviceBuffer& b, std::int64_t n) {
  const auto f = b.download_as<float>(static_cast<std::size_t>(n));
  return {f.begin(), f.end()};
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double d) { return std::isfinite(d); });
}

}  // namespace

// The widest alignment the case's strides allow (cuMemAlloc'ed bases are 256-byte aligned).
int stride_alignment(const Problem& p) {
  const auto eb = static_cast<std::int64_t>(storage_bytes(p.dtype));
  int a = 16;
  for (std::int64_t ld : {p.lda_x(), p.lda_w(), p.lda_y()}) {
    // Problem::validate() rejects such strides later; ld * eb must not overflow before that
    // (found by tests/fuzz/sweep_line_fuzz.cpp).
    if (ld < 0 || ld > std::numeric_limits<std::int32_t>::max()) continue;
    a = std::min(a, natural_alignment(0, ld * eb));
  }
  return a;
}

bool is_blank_sweep_line(std::string_view line) {
  return tokens(strip_comment(line)).empty();
}

std::string SweepCase::text() const {
  const Problem& p = problem;
  std::string s = fmt::format("{} {} {} {}", format_shape(p.shape()), name(p.dtype), name(p.mode),
                              name(p.param_dtype));
  if (!p.has_bias) s += " nobias";
  if (!p.has_scale) s += " noscale";
  if (!p.has_affine) s += " noaffine";
  if (!p.momentum)
    s += " momentum=none";
  else if (*p.momentum != kDefaultMomentum)
    s += fmt::format(" momentum={}", *p.momentum);
  if (p.eps != kDefaultEps) s += fmt::format(" eps={}", p.eps);
  if (p.ldx) s += fmt::format(" ldx={}", p.ldx);
  if (p.ldw) s += fmt::format(" ldw={}", p.ldw);
  if (p.ldy) s += fmt::format(" ldy={}", p.ldy);
  if (p.alignment != stride_alignment(p)) s += fmt::format(" align={}", p.alignment);
  if (distribution == Distribution::non_centred) s += " non_centred";
  if (p.mode == Mode::train && !track_running_stats) s += " notrack";
  return s;
}

SweepCase parse_sweep_line(std::string_view line) {
  const auto tok = tokens(strip_comment(line));
  if (tok.size() < 3)
    throw InvalidArgument("sweep", fmt::format("expected 'MxNxK dtype mode [param_dtype] [flags]'; "
                                               "got '{}'",
                                               line));
  SweepCase c;
  Problem& p = c.problem;
  const Shape s = parse_shape(tok[0]);
  p.M = s.M, p.N = s.N, p.K = s.K;
  p.dtype = parse_dtype(tok[1]);
  p.mode = parse_mode(tok[2]);
  std::size_t i = 3;
  if (i < tok.size() && is_dtype_name(tok[i])) {
    p.param_dtype = tok[i] == "same" ? storage_type(p.dtype) : parse_dtype(tok[i]);
    ++i;
  }
  int align = 0;
  for (; i < tok.size(); ++i) {
    const std::string_view t = tok[i];
    const auto eq = t.find('=');
    const std::string_view key = t.substr(0, eq);
    const std::string_view val =
        eq == std::string_view::npos ? std::string_view{} : t.substr(eq + 1);
    if (t == "nobias") {
      p.has_bias = false;
    } else if (t == "noscale") {
      p.has_scale = false;
    } else if (t == "noaffine") {
      p.has_affine = false;
    } else if (t == "notrack") {
      c.track_running_stats = false;
    } else if (t == "centred" || t == "non_centred") {
      c.distribution = parse_distribution(t);
    } else if (key == "momentum" && !val.empty()) {
      if (val == "none")
        p.momentum = std::nullopt;
      else
        p.momentum = parse_double(key, val);
    } else if (key == "eps" && !val.empty()) {
      p.eps = parse_double(key, val);
    } else if (key == "ldx" && !val.empty()) {
      p.ldx = parse_int(key, val);
    } else if (key == "ldw" && !val.empty()) {
      p.ldw = parse_int(key, val);
    } else if (key == "ldy" && !val.empty()) {
      p.ldy = parse_int(key, val);
    } else if (key == "align" && !val.empty()) {
      // Range-checked before narrowing: align=4294967312 must not become align=16.
      const std::int64_t v = parse_int(key, val);
      if (v < 0 || v > 16)
        throw InvalidArgument("sweep", fmt::format("align={} is not one of 16, 8, 4, 2, 1", v));
      align = static_cast<int>(v);
    } else {
      throw InvalidArgument("sweep", fmt::format("unknown flag '{}' (expected nobias, noscale, "
                                                 "noaffine, notrack, centred, non_centred, "
                                                 "momentum=, eps=, ldx=, ldw=, ldy= or align=)",
                                                 t));
    }
  }
  const int natural = stride_alignment(p);
  if (align > natural)
    throw InvalidArgument(
        "sweep", fmt::format("align={} exceeds the {} bytes the strides allow", align, natural));
  p.alignment = align ? align : natural;
  p.validate();
  return c;
}
double sweep_threshold(DType dtype) {
  switch (dtype) {
    case DType::fp32:
    case DType::tf32x3:  // held to strict fp32's tolerance
      return 2e-5;
    case DType::tf32:
      return 2e-3;
    default:
      return 1e-2;
  }
}

double relative_error(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size() || !all_finite(got)) return INFINITY;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

double scaled_error(const std::vector<double>& got, const std::vector<double>& ref,
                    const std::vector<double>& scale) {
  if (got.size() != ref.size() || got.size() != scale.size() || !all_finite(got)) return INFINITY;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - ref[i];
    diff += d * d;
    norm += scale[i] * scale[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ---------------------------------------------------------------------------------------------
// Inputs

bool CaseInputs::count_batches() const {
  return c.problem.mode == Mode::train && (c.track_running_stats || !c.problem.momentum);
}

HostTensor make_x(const SweepCase& c, std::uint64_t seed) {
  const Problem& p = c.problem;
  HostTensor x(p.dtype, static_cast<std::size_t>(p.M * p.lda_x()));
  fill_random(x, c.distribution, seed);
  poison_padding(x, p.M, p.K, p.lda_x());
  return x;
}

CaseInputs make_case_inputs(const SweepCase& c, std::optional<std::uint64_t> seed) {
  const Problem& p = c.problem;
  CaseInputs in;
  in.c = c;
  in.seed = seed ? *seed : fresh_seed();
  const double bound = 1.0 / std::sqrt(static_cast<double>(p.K));
  in.x = make_x(c, sub_seed(in.seed, 1));
  in.w = HostTensor(p.dtype, static_cast<std::size_t>(p.N * p.lda_w()));
  fill_uniform(in.w, -bound, bound, sub_seed(in.seed, 2));
  poison_padding(in.w, p.N, p.K, p.lda_w());
  in.bias = param_tensor(p, p.has_bias);
  if (p.has_bias) fill_uniform(in.bias, -bound, bound, sub_seed(in.seed, 3));
  in.scale = param_tensor(p, p.has_scale);
  if (p.has_scale) fill_normal(in.scale, 0.0, 1.0, sub_seed(in.seed, 4));
  in.gamma = param_tensor(p, p.has_affine);
  in.beta = param_tensor(p, p.has_affine);
  if (p.has_affine) {
    fill_normal(in.gamma, 1.0, 0.25, sub_seed(in.seed, 5));
    fill_normal(in.beta, 0.0, 0.5, sub_seed(in.seed, 6));
  }
  const bool tracked = p.mode == Mode::eval || c.track_running_stats;
  in.running_mean = param_tensor(p, tracked);
  in.running_var = param_tensor(p, tracked);
  if (tracked) {
    fill_normal(in.running_mean, 0.0, 0.5, sub_seed(in.seed, 7));
    fill_uniform(in.running_var, 0.5, 1.5, sub_seed(in.seed, 8));
  }
  in.num_batches_tracked = static_cast<std::int64_t>(sub_seed(in.seed, 9) % 10);
  return in;
}

ReferenceInputs reference_inputs(const CaseInputs& in, Tf32Operands tf32) {
  const Problem& p = in.c.problem;
  ReferenceInputs r;
  r.M = p.M, r.N = p.N, r.K = p.K;
  r.x = in.x.packed(static_cast<std::size_t>(p.M), static_cast<std::size_t>(p.K),
                    static_cast<std::size_t>(p.lda_x()));
  r.w = in.w.packed(static_cast<std::size_t>(p.N), static_cast<std::size_t>(p.K),
                    static_cast<std::size_t>(p.lda_w()));
  r.bias = in.bias.to_doubles();
  r.scale = in.scale.to_doubles();
  r.gamma = in.gamma.to_doubles();
  r.beta = in.beta.to_doubles();
  r.running_mean = in.running_mean.to_doubles();
  r.running_var = in.running_var.to_doubles();
  // tf32 math multiplies tf32-rounded operands: the reference takes the same operands, so the
  // comparison measures the kernel, not tf32 itself (whose input rounding, amplified by
  // cancellation in a 2-row variance, can alone exceed the threshold). Rounded with ties away,
  // as the tiled kernel does; warpspec's copy engine breaks ties to even, a tf32 step apart in
  // about one element in 16000.
  if (p.dtype == DType::tf32 && tf32 != Tf32Operands::whole) {
    const auto read = tf32 == Tf32Operands::rounded ? round_to_tf32 : truncate_to_tf32;
    for (auto& v : r.x) v = read(static_cast<float>(v));
    for (auto& v : r.w) v = read(static_cast<float>(v));
  }
  return r;
}

std::vector<double> reference_saved(ReferenceInputs in, Mode mode, unsigned threads) {
  // a = x W^T is reference_linear without bias and scale.
  const std::vector<double> bias = std::move(in.bias);
  in.bias.clear();
  in.scale.clear();
  std::vector<double> out = reference_linear(in, threads);
  const auto M = static_cast<std::size_t>(in.M), N = static_cast<std::size_t>(in.N);
  for (std::size_t n = 0; n < N; ++n) {
    double shift = 0;
    if (mode == Mode::train) {
      for (std::size_t m = 0; m < M; ++m) shift += out[m * N + n];
      shift = -shift / static_cast<double>(M);
    } else if (!bias.empty()) {
      shift = bias[n];
    }
    for (std::size_t m = 0; m < M; ++m) out[m * N + n] += shift;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Device side

DeviceCase::DeviceCase(const CaseInputs& in, bool with_saved)
    : c_(in.c), count_(in.count_batches()) {
  const Problem& p = c_.problem;
  x_ = alloc_like(in.x);
  w_ = alloc_like(in.w);
  y_ = DeviceBuffer(static_cast<std::size_t>(p.M * p.lda_y()) * storage_bytes(p.dtype));
  if (with_saved) saved_ = DeviceBuffer(y_.size());
  bias_ = alloc_like(in.bias);
  scale_ = alloc_like(in.scale);
  gamma_ = alloc_like(in.gamma);
  beta_ = alloc_like(in.beta);
  rm_ = alloc_like(in.running_mean);
  rv_ = alloc_like(in.running_var);
  if (count_) nbt_ = DeviceBuffer(sizeof(std::int64_t));
  if (p.mode == Mode::train) {
    save_mean_ = DeviceBuffer(static_cast<std::size_t>(p.N) * sizeof(float));
    save_invstd_ = DeviceBuffer(static_cast<std::size_t>(p.N) * sizeof(float));
  }
  reset(in);
}

void DeviceCase::reset(const CaseInputs& in) {
  upload(x_, in.x);
  upload(w_, in.w);
  upload(bias_, in.bias);
  upload(scale_, in.scale);
  upload(gamma_, in.gamma);
  upload(beta_, in.beta);
  upload(rm_, in.running_mean);
  upload(rv_, in.running_var);
  if (count_) nbt_.upload(&in.num_batches_tracked, sizeof(std::int64_t));
  poison_outputs();
}

void DeviceCase::poison_outputs() {
  y_.fill_words(nan_word(c_.problem.dtype));
  saved_.fill_words(nan_word(c_.problem.dtype));
  save_mean_.fill_words(nan_word(DType::fp32));
  save_invstd_.fill_words(nan_word(DType::fp32));
}

void DeviceCase::upload_x(const HostTensor& x) {
  if (x.bytes() != x_.size())
    throw InvalidArgument("x", fmt::format("expected {} bytes; got {}", x_.size(), x.bytes()));
  upload(x_, x);
}

void DeviceCase::upload_x_rows(const HostTensor& x, std::int64_t rows) {
  const Problem& p = c_.problem;
  const std::size_t need = static_cast<std::size_t>(rows * p.lda_x()) * storage_bytes(p.dtype);
  if (rows < 1 || rows > p.M || x.bytes() != need)
    throw InvalidArgument(
        "x", fmt::format("expected {} rows ({} bytes) of at most {}; got {} bytes", rows, need, p.M,
                         x.bytes()));
  x_.upload(x.data(), x.bytes());
  poison_outputs();
}

Tensors DeviceCase::tensors() const {
  Tensors t;
  t.x = x_.get();
  t.w = w_.get();
  t.y = y_.get();
  t.bias = bias_.get();
  t.scale = scale_.get();
  t.gamma = gamma_.get();
  t.beta = beta_.get();
  t.running_mean = rm_.get();
  t.running_var = rv_.get();
  t.num_batches_tracked = nbt_.as<std::int64_t>();
  t.save_mean = save_mean_.as<float>();
  t.save_invstd = save_invstd_.as<float>();
  t.saved = saved_.get();
  return t;
}

std::vector<double> download_packed(const DeviceBuffer& b, DType dtype, std::int64_t rows,
                                    std::int64_t cols, std::int64_t ld) {
  HostTensor h(dtype, static_cast<std::size_t>(rows * ld));
  b.download(h.data(), h.bytes());
  return h.packed(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                  static_cast<std::size_t>(ld));
}

BackwardTensors backward_inputs(Mode mode, const Tensors& f, const void* dy) {
  BackwardTensors t;
  t.dy = dy;
  t.x = f.x;
  t.w = f.w;
  t.saved = f.saved;
  t.scale = f.scale;
  t.gamma = f.gamma;
  if (mode == Mode::eval) {
    t.running_mean = f.running_mean;
    t.running_var = f.running_var;
  } else {
    t.save_mean = f.save_mean;
    t.save_invstd = f.save_invstd;
  }
  return t;
}

CaseOutputs DeviceCase::download(std::int64_t rows) const {
  Problem p = c_.problem;
  p.M = rows;
  CaseOutputs out;
  // y, or saved (laid out like y): its first rows packed, and whether its padding columns
  // still hold the poison.
  auto download_like_y = [&p](const DeviceBuffer& b, std::vector<double>& values, bool& intact) {
    HostTensor y(p.dtype, static_cast<std::size_t>(p.M * p.lda_y()));
    b.download(y.data(), y.bytes());
    values = y.packed(static_cast<std::size_t>(p.M), static_cast<std::size_t>(p.N),
                      static_cast<std::size_t>(p.lda_y()));
    HostTensor poison(p.dtype, 1);
    poison.poison();
    const std::size_t eb = storage_bytes(p.dtype);
    const auto* bytes = static_cast<const unsigned char*>(y.data());
    intact = true;
    for (std::int64_t r = 0; r < p.M && intact; ++r)
      for (std::int64_t c = p.N; c < p.lda_y(); ++c)
        if (std::memcmp(bytes + static_cast<std::size_t>(r * p.lda_y() + c) * eb, poison.data(),
                        eb)) {
          intact = false;
          break;
        }
  };
  download_like_y(y_, out.y, out.y_padding_intact);
  if (!saved_.empty()) download_like_y(saved_, out.saved, out.saved_padding_intact);
  if (!rm_.empty()) {
    out.running_mean = download_param(rm_, p.param_dtype, p.N);
    out.running_var = download_param(rv_, p.param_dtype, p.N);
  }
  if (!save_mean_.empty()) {
    out.save_mean = download_floats(save_mean_, p.N);
    out.save_invstd = download_floats(save_invstd_, p.N);
  }
  if (count_) nbt_.download(&out.num_batches_tracked, sizeof(std::int64_t));
  return out;
}

double CaseErrors::worst() const {
  return std::max({y, running_mean, running_var, save_mean, save_invstd, saved});
}

CaseErrors compare(const CaseInputs& in, const CaseOutputs& got, const ReferenceOutputs& ref,
                   const std::vector<double>* ref_saved) {
  const bool train = in.c.problem.mode == Mode::train;
  CaseErrors e;
  e.y = relative_error(got.y, ref.y);
  e.non_finite = !all_finite(got.y);
  if (!got.saved.empty()) {
    std::vector<double> own;
    if (!ref_saved) own = reference_saved(reference_inputs(in), in.c.problem.mode);
    e.saved = relative_error(got.saved, ref_saved ? *ref_saved : own);
    e.non_finite |= !all_finite(got.saved);
  }
  if (!in.running_mean.empty()) {
    e.running_mean = relative_error(got.running_mean, ref.running_mean);
    e.running_var = relative_error(got.running_var, ref.running_var);
    e.non_finite |= !all_finite(got.running_mean) || !all_finite(got.running_var);
  }
  if (train) {
    // Batch statistics are measured on their natural scale. A column mean is known to within
    // rounding of the column's RMS, sqrt(mean^2 + var), not of the mean itself (which may be
    // ~0); a variance to within rounding of E[z^2], so invstd's error is weighted by
    // (var + eps) / (E[z^2] + eps), the inverse condition number of the variance. Without this
    // a 2-row column or a near-zero mean fails on rounding no kernel can avoid.
    const double eps = in.c.problem.eps;
    std::vector<double> rms(ref.save_mean.size()), weighted_got(rms.size()),
        weighted_ref(rms.size());
    for (std::size_t n = 0; n < rms.size(); ++n) {
      const double var = 1.0 / (ref.save_invstd[n] * ref.save_invstd[n]) - eps;
      const double ez2 = ref.save_mean[n] * ref.save_mean[n] + std::max(var, 0.0);
      rms[n] = std::sqrt(ez2);
      const double w = (std::max(var, 0.0) + eps) / (ez2 + eps);
      weighted_got[n] = n < got.save_invstd.size() ? got.save_invstd[n] * w : NAN;
      weighted_ref[n] = ref.save_invstd[n] * w;
    }
    e.save_mean = scaled_error(got.save_mean, ref.save_mean, rms);
    // The running stats move by factor x (batch stat), so they inherit the batch stats' natural
    // scales; stored in fp16 they also carry its spacing, which below the smallest normal
    // (6.1e-5) is absolute: a 2-row variance of 1e-6 is one subnormal step from its neighbour.
    if (!in.running_mean.empty()) {
      const Problem& p = in.c.problem;
      const double factor =
          p.momentum ? *p.momentum : 1.0 / static_cast<double>(in.num_batches_tracked + 1);
      const double unbias = static_cast<double>(p.M) / static_cast<double>(p.M - 1);
      const double floor = p.param_dtype == DType::fp16 ? 6.1e-5 : 0.0;
      std::vector<double> rm_scale(rms.size()), rv_scale(rms.size());
      for (std::size_t n = 0; n < rms.size() && n < ref.running_mean.size(); ++n) {
        rm_scale[n] = std::abs(ref.running_mean[n]) + factor * rms[n] + floor;
        rv_scale[n] = std::abs(ref.running_var[n]) + factor * rms[n] * rms[n] * unbias + floor;
      }
      e.running_mean = scaled_error(got.running_mean, ref.running_mean, rm_scale);
      e.running_var = scaled_error(got.running_var, ref.running_var, rv_scale);
    }
    e.save_invstd = got.save_invstd.size() == rms.size()
                        ? relative_error(weighted_got, weighted_ref)
                        : INFINITY;
    e.non_finite |= !all_finite(got.save_mean) || !all_finite(got.save_invstd);
  }
  e.counter_ok = !in.count_batches() || got.num_batches_tracked == ref.num_batches_tracked;
  e.padding_ok = got.y_padding_intact && got.saved_padding_intact;
  e.stats_kept =
      train || (got.running_mean == ref.running_mean && got.running_var == ref.running_var);
  return e;
}

std::string_view name(Tf32Operands t) {
  switch (t) {
    case Tf32Operands::rounded:
      return "rounded";
    case Tf32Operands::truncated:
      return "truncated";
    default:
      return "whole";
  }
}

ReadingErrors compare_readings(const CaseInputs& in, const CaseOutputs& got,
                               const ReferenceSettings& s, std::span<const Tf32Operands> reads,
                               double threshold, std::string* why) {
  if (reads.empty()) throw InvalidArgument("reads", "expected at least one tf32 reading");
  if (in.c.problem.dtype != DType::tf32) reads = reads.first(1);
  ReadingErrors best;
  for (std::size_t i = 0; i < reads.size() && !best.passed; ++i) {
    const ReferenceInputs ri = reference_inputs(in, reads[i]);
    std::vector<double> ref_saved;
    if (!got.saved.empty()) ref_saved = reference_saved(ri, in.c.problem.mode, s.threads);
    const CaseErrors e = compare(in, got, reference_forward(ri, s), &ref_saved);
    std::string reasons;
    const bool ok = passes(e, threshold, &reasons);
    if (ok || i == 0 || e.worst() < best.errors.worst()) {
      best = {e, reads[i], ok};
      if (why)
        *why = ok || reads.size() == 1 ? reasons
                                       : fmt::format("closest of {} tf32 readings: {}; {}",
                                                     reads.size(), name(reads[i]), reasons);
    }
  }
  return best;
}

bool passes(const CaseErrors& e, double threshold, std::string* why) {
  std::string s;
  auto note = [&s](const std::string& w) { s += (s.empty() ? "" : "; ") + w; };
  if (e.non_finite) note("NaN or inf in the output");
  if (!e.counter_ok) note("num_batches_tracked did not advance by exactly 1");
  if (!e.padding_ok) note("y or saved was written past column N (ldy padding)");
  if (!e.stats_kept) note("eval changed the running stats");
  if (!(e.worst() < threshold))
    note(fmt::format("relative error {:.2e} (y {:.2e}) above {:.0e}", e.worst(), e.y, threshold));
  if (why != nullptr) *why = s;
  return s.empty();
}

}  // namespace fusejit
