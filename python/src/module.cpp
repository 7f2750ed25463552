// fusejit._C: the Python face of the installed C++ API (include/fusejit), for fusejit.torch.
// It takes raw device pointers, row strides and a stream handle as integers and never sees a
// framework tensor, so one build works with any PyTorch (or none): fusejit.torch turns tensors
// into these arguments.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/fusejit.hpp"

namespace nb = nanobind;
using namespace fusejit;

namespace {

template <class T>
T* ptr(std::uintptr_t v) {
  return reinterpret_cast<T*>(v);
}

// The layer as fusejit::Problem, from what fusejit.torch reads off the tensors.
Problem make_problem(std::int64_t M, std::int64_t N, std::int64_t K, const std::string& dtype,
                     const std::string& mode, const std::string& param_dtype, double eps,
                     std::optional<double> momentum, bool has_bias, bool has_scale, bool has_affine,
                     std::int64_t ldx, std::int64_t ldw, std::int64_t ldy) {
  Problem p;
  p.M = M, p.N = N, p.K = K;
  p.dtype = parse_dtype(dtype);
  p.param_dtype = parse_dtype(param_dtype);
  p.mode = parse_mode(mode);
  p.eps = eps;
  p.momentum = momentum;
  p.has_bias = has_bias, p.has_scale = has_scale, p.has_affine = has_affine;
  p.ldx = ldx, p.ldw = ldw, p.ldy = ldy;
  return p;
}

// One layer's plan: made for M rows (kernels shared with every other M of the layer's M class),
// without a workspace of its own; Python passes one from its allocator to every run.
class PyPlan {
 public:
  PyPlan(std::int64_t M, std::int64_t N, std::int64_t K, const std::string& dtype,
         const std::string& mode, const std::string& param_dtype, double eps,
         std::optional<double> momentum, bool has_bias, bool has_scale, bool has_affine,
         std::int64_t ldx, std::int64_t ldw, std::int64_t ldy, int device,
         const std::optional<std::string>& variant, const std::optional<std::string>& config,
         bool use_tuning_db)
      : plan_(make_problem(M, N, K, dtype, mode, param_dtype, eps, momentum, has_bias, has_scale,
                           has_affine, ldx, ldw, ldy),
              options(device, variant, config, use_tuning_db)) {}

  void run(std::uintptr_t stream, std::uintptr_t x, std::uintptr_t w, std::uintptr_t y,
           std::uintptr_t bias, std::uintptr_t scale, std::uintptr_t gamma, std::uintptr_t beta,
           std::uintptr_t running_mean, std::uintptr_t running_var,
           std::uintptr_t num_batches_tracked, std::uintptr_t save_mean, std::uintptr_t save_invstd,
           std::uintptr_t workspace, std::size_t workspace_bytes, std::uintptr_t saved) {
    Tensors t;
    t.x = ptr<const void>(x);
    t.w = ptr<const void>(w);
    t.y = ptr<void>(y);
    t.bias = ptr<const void>(bias);
    t.scale = ptr<const void>(scale);
    t.gamma = ptr<const void>(gamma);
    t.beta = ptr<const void>(beta);
    t.running_mean = ptr<void>(running_mean);
    t.running_var = ptr<void>(running_var);
    t.num_batches_tracked = ptr<std::int64_t>(num_batches_tracked);
    t.save_mean = ptr<float>(save_mean);
    t.save_invstd = ptr<float>(save_invstd);
    t.saved = ptr<void>(saved);
    // The launch is host work only (microseconds); no reason to hold other Python threads.
    nb::gil_scoped_release release;
    plan_.run(reinterpret_cast<CUstream>(stream), t, ptr<void>(workspace), workspace_bytes);
  }

  std::size_t workspace_size() const { return plan_.workspace_size(); }
  std::string config() const { return plan_.config().key(); }
  std::vector<std::string> kernel_names() const { return plan_.kernel_names(); }
  std::string dispatch() const { return plan_.dispatch(); }
  bool uses_reference() const { return plan_.uses_reference(); }

 private:
  // variant / config / use_tuning_db: PlanOptions' overrides of the planner's choice (forcing
  // a kernel for a comparison, or the built-in heuristic without the tuning database).
  static PlanOptions options(int device, const std::optional<std::string>& variant,
                             const std::optional<std::string>& config, bool use_tuning_db) {
    PlanOptions o;
    o.device = device;
    o.allocate_workspace = false;
    if (variant) o.variant = parse_variant(*variant);
    if (config) o.config = KernelConfig::parse(*config);
    o.use_tuning_db = use_tuning_db;
    return o;
  }

  Plan plan_;
};

// The layer's backward (fusejit::BackwardPlan), made for M rows without a workspace of its own,
// like PyPlan. Zero pointers are absent tensors: a gradient not wanted, a parameter the layer
// does not have.
class PyBackwardPlan {
 public:
  PyBackwardPlan(std::int64_t M, std::int64_t N, std::int64_t K, const std::string& dtype,
                 const std::string& mode, const std::string& param_dtype, double eps,
                 std::optional<double> momentum, bool has_bias, bool has_scale, bool has_affine,
                 std::int64_t ldx, std::int64_t ldw, std::int64_t ldy, int device)
      : plan_(make_problem(M, N, K, dtype, mode, param_dtype, eps, momentum, has_bias, has_scale,
                           has_affine, ldx, ldw, ldy),
              options(device)) {}

  void run(std::uintptr_t stream, std::uintptr_t dy, std::uintptr_t x, std::uintptr_t w,
           std::uintptr_t saved, std::uintptr_t scale, std::uintptr_t gamma,
           std::uintptr_t running_mean, std::uintptr_t running_var, std::uintptr_t save_mean,
           std::uintptr_t save_invstd, std::uintptr_t dx, std::uintptr_t dw, std::uintptr_t dbias,
           std::uintptr_t dscale, std::uintptr_t dgamma, std::uintptr_t dbeta,
           std::uintptr_t workspace, std::size_t workspace_bytes) {
    BackwardTensors t;
    t.dy = ptr<const void>(dy);
    t.x = ptr<const void>(x);
    t.w = ptr<const void>(w);
    t.saved = ptr<const void>(saved);
    t.scale = ptr<const void>(scale);
    t.gamma = ptr<const void>(gamma);
    t.running_mean = ptr<const void>(running_mean);
    t.running_var = ptr<const void>(running_var);
    t.save_mean = ptr<const float>(save_mean);
    t.save_invstd = ptr<const float>(save_invstd);
    t.dx = ptr<void>(dx);
    t.dw = ptr<void>(dw);
    t.dbias = ptr<void>(dbias);
    t.dscale = ptr<void>(dscale);
    t.dgamma = ptr<void>(dgamma);
    t.dbeta = ptr<void>(dbeta);
    nb::gil_scoped_release release;
    plan_.run(reinterpret_cast<CUstream>(stream), t, plan_.problem().M, ptr<void>(workspace),
              workspace_bytes);
  }

  std::size_t workspace_size() const { return plan_.workspace_size(); }
  std::string config() const { return plan_.config_key(); }

 private:
  static BackwardOptions options(int device) {
    BackwardOptions o;
    o.device = device;
    o.allocate_workspace = false;
    return o;
  }

  BackwardPlan plan_;
};

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fusejit's C++ API for fusejit.torch: plans made from sizes, runs given pointers";
  // InvalidArgument names the argument: a ValueError to Python; every other fusejit error
  // (CUDA, NVRTC, unsupported device) a RuntimeError with fusejit's message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.def("version", [] { return std::string(version()); });
  m.def(
      "device_supported",
      [](int device) -> std::pair<bool, std::string> {
        std::string why;
        if (!driver_available(&why)) return {false, why};
        try {
          const Device d = Device::get(device);
          if (d.cc() < 80)
            return {false, d.name + " is sm_" + std::to_string(d.cc()) + "; fusejit needs 8.0+"};
          return {true, ""};
        } catch (const std::exception& e) {
          return {false, e.what()};
        }
      },
      nb::arg("device"));
  nb::class_<PyPlan>(m, "Plan")
      .def(nb::init<std::int64_t, std::int64_t, std::int64_t, const std::string&,
                    const std::string&, const std::string&, double, std::optional<double>, bool,
                    bool, bool, std::int64_t, std::int64_t, std::int64_t, int,
                    const std::optional<std::string>&, const std::optional<std::string>&, bool>(),
           nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("dtype"), nb::arg("mode"),
           nb::arg("param_dtype"), nb::arg("eps"), nb::arg("momentum").none(), nb::arg("has_bias"),
           nb::arg("has_scale"), nb::arg("has_affine"), nb::arg("ldx"), nb::arg("ldw"),
           nb::arg("ldy"), nb::arg("device"), nb::arg("variant").none() = nb::none(),
           nb::arg("config").none() = nb::none(), nb::arg("use_tuning_db") = true)
      .def("run", &PyPlan::run, nb::arg("stream"), nb::arg("x"), nb::arg("w"), nb::arg("y"),
           nb::arg("bias"), nb::arg("scale"), nb::arg("gamma"), nb::arg("beta"),
           nb::arg("running_mean"), nb::arg("running_var"), nb::arg("num_batches_tracked"),
           nb::arg("save_mean"), nb::arg("save_invstd"), nb::arg("workspace"),
           nb::arg("workspace_bytes"), nb::arg("saved") = 0)
      .def_prop_ro("workspace_size", &PyPlan::workspace_size)
      .def_prop_ro("config", &PyPlan::config)
      .def_prop_ro("kernel_names", &PyPlan::kernel_names)
      .def_prop_ro("dispatch", &PyPlan::dispatch)
      .def_prop_ro("uses_reference", &PyPlan::uses_reference);
  nb::class_<PyBackwardPlan>(m, "BackwardPlan")
      .def(nb::init<std::int64_t, std::int64_t, std::int64_t, const std::string&,
                    const std::string&, const std::string&, double, std::optional<double>, bool,
                    bool, bool, std::int64_t, std::int64_t, std::int64_t, int>(),
           nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("dtype"), nb::arg("mode"),
           nb::arg("param_dtype"), nb::arg("eps"), nb::arg("momentum").none(), nb::arg("has_bias"),
           nb::arg("has_scale"), nb::arg("has_affine"), nb::arg("ldx"), nb::arg("ldw"),
           nb::arg("ldy"), nb::arg("device"))
      .def("run", &PyBackwardPlan::run, nb::arg("stream"), nb::arg("dy"), nb::arg("x"),
           nb::arg("w"), nb::arg("saved"), nb::arg("scale"), nb::arg("gamma"),
           nb::arg("running_mean"), nb::arg("running_var"), nb::arg("save_mean"),
           nb::arg("save_invstd"), nb::arg("dx"), nb::arg("dw"), nb::arg("dbias"),
           nb::arg("dscale"), nb::arg("dgamma"), nb::arg("dbeta"), nb::arg("workspace"),
           nb::arg("workspace_bytes"))
      .def_prop_ro("workspace_size", &PyBackwardPlan::workspace_size)
      .def_prop_ro("config", &PyBackwardPlan::config);
}
