#include "tools/backward_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

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

bool all_nan(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double d) { return std::isnan(d); });
}

}  // namespace

bool passes(const BackwardCheckResult& r, double threshold, std::string* why) {
  std::string w;
  passes(r.errors, threshold, &w);
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
  po.use_tuning_db = o.use_tuning_db;
  const Plan forward(plan_problem, po);
  r.forward_reference = forward.uses_reference();
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
  bo.dx_cublaslt = o.dx_cublaslt;
  bo.dw_cublaslt = o.dw_cublaslt;
  const BackwardPlan backward(plan_problem, bo);
  r.config = backward.config_key();
  BackwardTensors bt = backward_inputs(p.mode, ft, dy_dev.get());
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
  // What the run left, against the reference. With accumulation the gradients started from
  // random values: those are added to a copy of the reference, its naturals and its scales.
  BackwardReferenceOutputs want = ref;
  BackwardGradients got;
  got.saved = download_packed(saved, st, p.M, p.N, p.lda_y());
  auto add_initial = [&](std::vector<double>& v, const HostTensor& before, std::int64_t rows,
                         std::int64_t cols, std::int64_t ld, bool magnitude) {
    const std::vector<double> b0 =
        before.packed(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                      static_cast<std::size_t>(ld));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += magnitude ? std::abs(b0[i]) : b0[i];
  };
  if (o.accumulate) {
    add_initial(want.dw, dw0, p.N, p.K, p.lda_w(), false);
    add_initial(want.dw_natural, dw0, p.N, p.K, p.lda_w(), false);
    for (std::vector<double>* v : {&want.dbias, &want.dscale, &want.dgamma, &want.dbeta})
      add_initial(*v, params0, 1, p.N, p.N, false);
    for (std::vector<double>* v : {&want.dbias_scale, &want.dscale_scale})
      add_initial(*v, params0, 1, p.N, p.N, true);
  }
  std::vector<double> got_dx = download_packed(dx, st, p.M, p.K, p.lda_x());
  std::vector<double> got_dw = download_packed(dw, st, p.N, p.K, p.lda_w());
  if (o.want_dx)
    got.dx = std::move(got_dx);
  else
    r.untouched_ok &= all_nan(got_dx);
  if (o.want_dw)
    got.dw = std::move(got_dw);
  else
    r.untouched_ok &= all_nan(got_dw);
  // The parameter gradients the case has and asked for. compare_gradients takes dgamma and
  // dbeta by relative error, dbias and dscale against the scale of their terms (train's dscale
  // is a sum of dy c that may cancel by chance, with c rounded to the storage type).
  auto param = [&](const DeviceBuffer& b, const std::vector<double>& ref_param,
                   std::vector<double>& out) {
    std::vector<double> g = download_packed(b, pd, 1, p.N, p.N);
    if (!o.want_params || ref_param.empty())
      r.untouched_ok &= all_nan(g);
    else
      out = std::move(g);
  };
  param(dgamma, ref.dgamma, got.dgamma);
  param(dbeta, ref.dbeta, got.dbeta);
  param(dbias, ref.dbias, got.dbias);
  param(dscale, ref.dscale, got.dscale);
  r.errors = compare_gradients(want, got);
  return r;
}

std::vector<std::string> builtin_backward_sweep(bool full) {
  std::vector<std::string> v;
  for (const char* mode : {"train", "eval"}) {
    for (const char* dt : {"bf16", "fp16", "tf32", "tf32x3", "fp32"}) {
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
    // A last column vector only partly inside N (8-byte rows allow vectors; N is not a multiple
    // of their width): the BatchNorm passes' within-vector tails.
    v.push_back(fmt::format("300x70x40 bf16 {} ldx=48 ldw=48 ldy=72", mode));
    v.push_back(fmt::format("300x71x40 fp32 {} ldx=40 ldw=40 ldy=72", mode));
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
