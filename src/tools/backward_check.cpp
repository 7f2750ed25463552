#include "tools/backward_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "fusejit/backward.hpp"
#include "fusejit/device/context.hpp"
#include "fusejit/device/device_memory.hpp"
#include "fusejit/plan.hpp"
#include "fusejit/verify/cpu_backward_reference.hpp"

namespace fusejit {

namespace {

// A [count] tensor of `dtype`'s storage type on the device, poisoned with NaN.
DeviceBuffer poisoned(DType dtype, std::int64_t count) {
  DeviceBuffer b(static_cast<std::size_t>(count) * storage_bytes(dtype));
  b.fill_words(nan_word(dtype));
  return b;
}

std::vector<double> download(const DeviceBuffer& b, DType dtype, std::int64_t rows,
                             std::int64_t cols, std::int64_t ld) {
  HostTensor h(dtype, static_cast<std::size_t>(rows * ld));
  b.download(h.data(), h.bytes());
  return h.packed(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                  static_cast<std::size_t>(ld));
}

bool all_nan(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double d) { return std::isnan(d); });
}

// ||got - ref|| / max(||ref||, ||natural||): relative error, unless cancellation made the
// reference small against its terms (cpu_backward_reference.hpp, dx_natural).
double gradient_error(const std::vector<double>& got, const std::vector<double>& ref,
                      const std::vector<double>& natural) {
  double n_ref = 0, n_nat = 0;
  for (double v : ref) n_ref += v * v;
  for (double v : natural) n_nat += v * v;
  const double rel = relative_error(got, ref);
  return n_nat > n_ref && n_ref > 0 ? rel * std::sqrt(n_ref / n_nat) : rel;
}

double finite_or_inf(double e) {
  return std::isfinite(e) ? e : INFINITY;
}

}  // namespace

double BackwardCheckResult::worst() const {
  return std::max({saved, dx, dw, dbias, dscale, dgamma, dbeta});
}

bool passes(const BackwardCheckResult& r, double threshold, std::string* why) {
  std::string w;
  auto figure = [&](double v, const char* name) {
    if (!(v < threshold))
      w += fmt::format("{}{} error {:.3g} >= {:.3g}", w.empty() ? "" : "; ", name, v, threshold);
  };
  figure(r.saved, "saved");
  figure(r.dx, "dx");
  figure(r.dw, "dw");
  figure(r.dbias, "dbias");
  figure(r.dscale, "dscale");
  figure(r.dgamma, "dgamma");
  figure(r.dbeta, "dbeta");
  if (!r.untouched_ok) w += std::string(w.empty() ? "" : "; ") + "wrote a gradient not asked for";
  if (why) *why = w;
  return w.empty();
}

BackwardCheckResult check_backward_case(const SweepCase& layer, const BackwardCheckOptions& o) {
  BackwardCheckResult r;
  const Problem plan_problem = layer.problem;
  SweepCase c = layer;
  if (o.rows) c.problem.M = o.rows;
  const Problem& p = c.problem;
  CaseInputs in = make_case_inputs(c);
  r.seed = in.seed;
  if (o.zero_gamma_column >= 0) in.gamma.set(static_cast<std::size_t>(o.zero_gamma_column), 0.f);
  if (o.zero_scale_column >= 0) in.scale.set(static_cast<std::size_t>(o.zero_scale_column), 0.f);
  const ScopedContext scope(context_for(o.device));
  DeviceCase dev(in);
  const Stream s;

  // Forward, saving what backward needs.
  PlanOptions po;
  po.device = o.device;
  po.cache_dir = o.cache_dir;
  const Plan forward(plan_problem, po);
  const DType st = storage_type(p.dtype);
  DeviceBuffer saved = poisoned(st, p.M * p.lda_y());
  Tensors ft = dev.tensors();
  ft.saved = saved.get();
  forward.run(s, ft, p.M);

  // dy: fresh, laid out like y.
  HostTensor dy(st, static_cast<std::size_t>(p.M * p.lda_y()));
  fill_normal(dy, 0.0, 1.0, in.seed + 1);
  DeviceBuffer dy_dev(dy.bytes());
  dy_dev.upload(dy.data(), dy.bytes());

  const DType pd = storage_type(p.param_dtype);
  DeviceBuffer dx = poisoned(st, p.M * p.lda_x());
  DeviceBuffer dw = poisoned(st, p.N * p.lda_w());
  DeviceBuffer dbias = poisoned(pd, p.N), dscale = poisoned(pd, p.N), dgamma = poisoned(pd, p.N),
               dbeta = poisoned(pd, p.N);
  // Accumulation: the gradients start from random values the result must be added to.
  HostTensor dw0(st, static_cast<std::size_t>(p.N * p.lda_w()));
  HostTensor params0(pd, static_cast<std::size_t>(p.N));
  if (o.accumulate) {
    fill_normal(dw0, 0.0, 1.0, in.seed + 2);
    dw.upload(dw0.data(), dw0.bytes());
    fill_normal(params0, 0.0, 1.0, in.seed + 3);
    for (DeviceBuffer* b : {&dbias, &dscale, &dgamma, &dbeta})
      b->upload(params0.data(), params0.bytes());
  }

  BackwardOptions bo;
  bo.device = o.device;
  bo.cache_dir = o.cache_dir;
  bo.accumulate = o.accumulate;
  bo.dx_config = o.dx_config;
  bo.dw_config = o.dw_config;
  const BackwardPlan backward(plan_problem, bo);
  r.config = backward.config_key();
  BackwardTensors bt;
  bt.dy = dy_dev.get();
  bt.x = ft.x;
  bt.w = ft.w;
  bt.saved = saved.get();
  bt.scale = ft.scale;
  bt.gamma = ft.gamma;
  if (p.mode == Mode::eval) {
    bt.running_mean = ft.running_mean;
    bt.running_var = ft.running_var;
  } else {
    bt.save_mean = ft.save_mean;
    bt.save_invstd = ft.save_invstd;
  }
  if (o.want_dx) bt.dx = dx.get();
  if (o.want_dw) bt.dw = dw.get();
  if (o.want_params) {
    if (p.has_bias) bt.dbias = dbias.get();
    if (p.has_scale) bt.dscale = dscale.get();
    if (p.has_affine) {
      bt.dgamma = dgamma.get();
      bt.dbeta = dbeta.get();
    }
  }
  backward.run(s, bt, p.M);
  s.synchronize();

  const BackwardReferenceOutputs ref =
      backward_reference(p, reference_inputs(in),
                         dy.packed(static_cast<std::size_t>(p.M), static_cast<std::size_t>(p.N),
                                   static_cast<std::size_t>(p.lda_y())));
  r.saved = finite_or_inf(relative_error(download(saved, st, p.M, p.N, p.lda_y()), ref.saved));

  auto added = [&](std::vector<double> grad, const HostTensor& before, std::int64_t rows,
                   std::int64_t cols, std::int64_t ld) {
    if (!o.accumulate) return grad;
    const std::vector<double> b0 =
        before.packed(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                      static_cast<std::size_t>(ld));
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] += b0[i];
    return grad;
  };
  const std::vector<double> got_dx = download(dx, st, p.M, p.K, p.lda_x());
  const std::vector<double> got_dw = download(dw, st, p.N, p.K, p.lda_w());
  if (o.want_dx)
    r.dx = finite_or_inf(gradient_error(got_dx, ref.dx, ref.dx_natural));
  else
    r.untouched_ok &= all_nan(got_dx);
  if (o.want_dw)
    r.dw = finite_or_inf(gradient_error(got_dw, added(ref.dw, dw0, p.N, p.K, p.lda_w()),
                                        added(ref.dw_natural, dw0, p.N, p.K, p.lda_w())));
  else
    r.untouched_ok &= all_nan(got_dw);
  // dgamma and dbeta by relative error; dbias and dscale against the scale of their terms
  // (train's dscale is a sum of dy c that may cancel by chance, with c rounded to the storage
  // type).
  auto param = [&](const DeviceBuffer& b, const std::vector<double>& want0,
                   const std::vector<double>* scale, double& out) {
    const std::vector<double> got = download(b, pd, 1, p.N, p.N);
    if (!o.want_params || want0.empty()) {
      r.untouched_ok &= all_nan(got);
      return;
    }
    const std::vector<double> want = added(want0, params0, 1, p.N, p.N);
    if (!scale) {
      out = finite_or_inf(relative_error(got, want));
      return;
    }
    std::vector<double> sc = *scale;
    if (o.accumulate)
      for (std::size_t i = 0; i < sc.size(); ++i) sc[i] += std::abs(params0.get(i));
    out = finite_or_inf(scaled_error(got, want, sc));
  };
  param(dgamma, ref.dgamma, nullptr, r.dgamma);
  param(dbeta, ref.dbeta, nullptr, r.dbeta);
  param(dbias, ref.dbias, &ref.dbias_scale, r.dbias);
  param(dscale, ref.dscale, &ref.dscale_scale, r.dscale);
  return r;
}

std::vector<std::string> builtin_backward_sweep(bool full) {
  std::vector<std::string> v;
  for (const char* mode : {"train", "eval"}) {
    for (const char* dt : {"bf16", "fp16", "tf32", "fp32"}) {
      v.push_back(fmt::format("256x64x128 {} {}", dt, mode));
      v.push_back(fmt::format("300x72x40 {} {}", dt, mode));
    }
    v.push_back(fmt::format("2x24x16 bf16 {}", mode));
    v.push_back(fmt::format("5000x136x96 fp16 {}", mode));
    v.push_back(fmt::format("300x64x64 bf16 {} nobias", mode));
    v.push_back(fmt::format("300x64x64 bf16 {} noscale", mode));
    v.push_back(fmt::format("300x64x64 bf16 {} noaffine", mode));
    v.push_back(fmt::format("300x64x64 bf16 {} nobias noscale noaffine", mode));
    v.push_back(fmt::format("300x64x64 bf16 {} same", mode));
    v.push_back(fmt::format("300x72x40 bf16 {} ldx=48 ldw=56 ldy=80", mode));
    v.push_back(fmt::format("1000x64x256 bf16 {} non_centred", mode));
    if (full) {
      v.push_back(fmt::format("1024x1024x1024 bf16 {}", mode));
      v.push_back(fmt::format("4096x512x256 fp16 {}", mode));
      v.push_back(fmt::format("3x7x5 fp32 {}", mode));
      v.push_back(fmt::format("129x1x8 bf16 {}", mode));
      v.push_back(fmt::format("300x72x40 fp32 {} ldx=41 ldy=75", mode));
    }
  }
  v.push_back("300x64x64 bf16 train momentum=none");
  v.push_back("300x64x64 bf16 train notrack");
  return v;
}

}  // namespace fusejit
