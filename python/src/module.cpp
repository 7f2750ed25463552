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
#include <memory>
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
    launch(stream, t, workspace, workspace_bytes);
  }

  void launch(std::uintptr_t stream, const Tensors& t, std::uintptr_t workspace,
              std::size_t workspace_bytes) {
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

// The Python C API's own reference handling, wrapped: a new reference (nullptr: a Python error
// is set, which nb::python_error carries back to the caller).
nb::object take(PyObject* o) {
  if (!o) throw nb::python_error();
  return nb::steal(o);
}

nb::object call0(const nb::object& fn) {
  return take(PyObject_CallNoArgs(fn.ptr()));
}

nb::object method0(nb::handle self, const nb::object& name) {
  PyObject* args[] = {self.ptr()};
  return take(
      PyObject_VectorcallMethod(name.ptr(), args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
}

bool truthy(const nb::object& o) {
  const int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw nb::python_error();
  return r == 1;
}

std::uintptr_t as_address(const nb::object& o) {
  const unsigned long long v = PyLong_AsUnsignedLongLong(o.ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  return static_cast<std::uintptr_t>(v);
}

// Interned names, made once (module init) so that a lookup hashes nothing.
struct Names {
  nb::object modules, parameters, buffers, gemm, bn, scale, weight, bias, running_mean, running_var,
      num_batches_tracked, training, track_running_stats, momentum, eps, data_ptr, dtype, shape,
      stride, get_device, requires_grad, new_empty, run;
};
Names* names = nullptr;

nb::object intern(const char* s) {
  return take(PyUnicode_InternFromString(s));
}

// Bumped by forget_recorded_calls() (fusejit.torch's clear_plan_cache): records made before it
// lapse. Read and written with the GIL held.
std::uint64_t recorded_generation = 0;

// A LinearScaleBatchNorm1d's forward (fusejit.torch) as its checked call decided it, replayed
// while nothing that decision read has changed. As Python, these checks cost ~8 us per call
// (attribute reads, calls and comparisons as bytecode) against ~5 us for the launch; here they
// are dictionary lookups and pointer comparisons through the C API.
//
// A replay re-reads, from the modules' instance dictionaries as nn.Module keeps them: the
// submodules gemm and bn and the layer's eight tensors (gemm.weight, gemm.bias, scale,
// bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked) as the same
// objects; BatchNorm's training, track_running_stats, momentum and eps; each tensor the kernels
// use at its recorded address with its recorded dtype (a move, a cast or `.data =` change one);
// the weight's shape and strides. x must be a torch.Tensor (no subclass) whose shape, strides,
// dtype, device and 16-byte alignment (and, for fp32, the TF32 setting) select a recorded plan.
// Anything else, autocast, and every record made before forget_recorded_calls(): None, and
// fusejit.torch takes its checked path.
class RecordedCall {
  static constexpr int kTensors = 8;
  static constexpr std::size_t kMaxPlans = 64;  // x layouts (a loop over batch sizes adds one each)
  static constexpr int kFlags = 4;

  struct Layer {
    PyObject* gemm = nullptr;
    PyObject* bn = nullptr;
    PyObject* tensors[kTensors] = {};
    PyObject* flags[kFlags] = {};
    nb::object dicts[3];  // hold the instance dictionaries the pointers above are borrowed from
  };
  struct Used {
    nb::object tensor;
    std::uintptr_t address;
    nb::object dtype;
  };
  struct XKey {
    nb::object key, shape;
    std::uintptr_t address;
  };

 public:
  // Made by make(). args: the eight tensors as the call gave them to the kernels (None where the
  // BatchNorm's decisions left one out); hooks as fusejit.torch reads them: stream() -> the current
  // stream's handle, tf32() -> bool (None unless fp32), autocast() -> bool, grad_enabled() -> bool.
  RecordedCall(const Layer& layer, nb::tuple args, nb::object stream, nb::object tf32,
               nb::object autocast, nb::object grad_enabled, nb::object tensor_type,
               nb::object byte_dtype, std::size_t workspace_align)
      : stream_(std::move(stream)),
        tf32_(std::move(tf32)),
        autocast_(std::move(autocast)),
        grad_enabled_(std::move(grad_enabled)),
        tensor_type_(std::move(tensor_type)),
        byte_dtype_(std::move(byte_dtype)),
        workspace_align_(workspace_align),
        generation_(recorded_generation),
        plans_(take(PyDict_New())) {
    if (args.size() != kTensors) throw nb::value_error("RecordedCall: args must hold 8 entries");
    gemm_ = nb::borrow(layer.gemm);
    bn_ = nb::borrow(layer.bn);
    for (int i = 0; i < kTensors; ++i) tensors_[i] = nb::borrow(layer.tensors[i]);
    for (int i = 0; i < kFlags; ++i) flags_[i] = nb::borrow(layer.flags[i]);
    for (int i = 0; i < kTensors; ++i) {
      const nb::handle a = PyTuple_GET_ITEM(args.ptr(), i);
      launch_ptrs_[i] = 0;
      if (a.is_none()) continue;
      Used u{nb::borrow(a), as_address(method0(a, names->data_ptr)),
             take(PyObject_GetAttr(a.ptr(), names->dtype.ptr()))};
      launch_ptrs_[i] = u.address;
      used_.push_back(std::move(u));
    }
    if (launch_ptrs_[0] == 0)
      throw nb::value_error("RecordedCall: args[0] (the weight) is required");
    const nb::handle w = used_.front().tensor;
    w_shape_ = take(PyObject_GetAttr(w.ptr(), names->shape.ptr()));
    w_stride_ = method0(w, names->stride);
    N_ = PyLong_AsLongLong(PyTuple_GetItem(w_shape_.ptr(), 0));
    if (PyErr_Occurred()) throw nb::python_error();
  }

  // A record of `module`, or None where its layer is not laid out as LinearScaleBatchNorm1d
  // lays it out (e.g. a BatchNorm whose eps is a class attribute): such a module is not
  // replayed, every call takes the checked path.
  static nb::object make(nb::handle module, nb::tuple args, nb::object stream, nb::object tf32,
                         nb::object autocast, nb::object grad_enabled, nb::object tensor_type,
                         nb::object byte_dtype, std::size_t workspace_align) {
    Layer layer;
    if (!read_layer(module, layer)) return nb::none();
    auto made = std::make_unique<RecordedCall>(
        layer, std::move(args), std::move(stream), std::move(tf32), std::move(autocast),
        std::move(grad_enabled), std::move(tensor_type), std::move(byte_dtype), workspace_align);
    nb::object o = nb::cast(made.get(), nb::rv_policy::take_ownership);
    made.release();  // Python's now
    return o;
  }

  // Whether the layer is as recorded.
  bool matches(nb::handle module) const {
    if (generation_ != recorded_generation) return false;
    Layer now;
    if (!read_layer(module, now) || now.gemm != gemm_.ptr() || now.bn != bn_.ptr()) return false;
    for (int i = 0; i < kTensors; ++i)
      if (now.tensors[i] != tensors_[i].ptr()) return false;
    for (int i = 0; i < kFlags; ++i)
      if (!equal(now.flags[i], flags_[i].ptr())) return false;
    // The objects are the recorded ones (held here), so their state is read from them.
    for (const Used& u : used_) {
      if (as_address(method0(u.tensor, names->data_ptr)) != u.address) return false;
      if (take(PyObject_GetAttr(u.tensor.ptr(), names->dtype.ptr())).ptr() != u.dtype.ptr())
        return false;
    }
    const nb::handle w = used_.front().tensor;
    return equal(take(PyObject_GetAttr(w.ptr(), names->shape.ptr())).ptr(), w_shape_.ptr()) &&
           equal(method0(w, names->stride).ptr(), w_stride_.ptr());
  }

  void add(nb::handle x, nb::object plan, std::size_t workspace_bytes) {
    if (static_cast<std::size_t>(PyDict_Size(plans_.ptr())) >= kMaxPlans)
      PyDict_Clear(plans_.ptr());
    const XKey key = x_key(x);
    nb::object entry = take(PyTuple_Pack(2, plan.ptr(), nb::int_(workspace_bytes).ptr()));
    if (PyDict_SetItem(plans_.ptr(), key.key.ptr(), entry.ptr()) < 0) throw nb::python_error();
  }

  // The plan recorded for x's layout, or None.
  nb::object plan_for(nb::handle x) const {
    PyObject* got = lookup(x_key(x).key);
    return got ? nb::borrow(PyTuple_GET_ITEM(got, 0)) : nb::none();
  }

  std::size_t plan_count() const { return static_cast<std::size_t>(PyDict_Size(plans_.ptr())); }

  // y where the record applies and nothing needs autograd; (plan, workspace_bytes, stream,
  // x_address) where it applies and x or a used tensor requires grad (fusejit.torch runs the
  // autograd Function with it); None where the checked path must decide.
  nb::object replay(nb::handle module, nb::handle x) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(x.ptr())) != tensor_type_.ptr()) return nb::none();
    if (truthy(call0(autocast_)) || !matches(module)) return nb::none();
    const XKey key = x_key(x);
    PyObject* got = lookup(key.key);
    if (!got) return nb::none();
    // Held: a hook below could run Python that changes the dictionary.
    const nb::object entry = nb::borrow(got);
    const nb::handle plan = PyTuple_GET_ITEM(entry.ptr(), 0);
    const nb::handle ws_bytes_obj = PyTuple_GET_ITEM(entry.ptr(), 1);
    const nb::object stream = call0(stream_);
    if (needs_grad(x))
      return take(PyTuple_Pack(4, plan.ptr(), ws_bytes_obj.ptr(), stream.ptr(),
                               nb::int_(key.address).ptr()));
    const std::size_t ws_bytes = PyLong_AsSize_t(ws_bytes_obj.ptr());
    if (PyErr_Occurred()) throw nb::python_error();
    // y, and the workspace, from PyTorch's allocator (stream-ordered like the run).
    nb::object rows = take(PySequence_GetItem(key.shape.ptr(), 0));
    nb::object size = take(PyTuple_Pack(2, rows.ptr(), nb::int_(N_).ptr()));
    nb::object y = new_empty(x, size, nb::handle());
    nb::object ws;
    std::uintptr_t ws_address = 0;
    if (ws_bytes) {
      nb::object ws_size = take(PyTuple_Pack(1, nb::int_(ws_bytes + workspace_align_).ptr()));
      ws = new_empty(x, ws_size, byte_dtype_);
      const std::uintptr_t a = as_address(method0(ws, names->data_ptr));
      ws_address = (a + workspace_align_ - 1) / workspace_align_ * workspace_align_;
    }
    const std::uintptr_t y_address = as_address(method0(y, names->data_ptr));
    const std::uintptr_t s = as_address(stream);
    if (nb::isinstance<PyPlan>(plan)) {
      Tensors t;
      t.x = ptr<const void>(key.address);
      t.w = ptr<const void>(launch_ptrs_[0]);
      t.y = ptr<void>(y_address);
      t.bias = ptr<const void>(launch_ptrs_[1]);
      t.scale = ptr<const void>(launch_ptrs_[2]);
      t.gamma = ptr<const void>(launch_ptrs_[3]);
      t.beta = ptr<const void>(launch_ptrs_[4]);
      t.running_mean = ptr<void>(launch_ptrs_[5]);
      t.running_var = ptr<void>(launch_ptrs_[6]);
      t.num_batches_tracked = ptr<std::int64_t>(launch_ptrs_[7]);
      nb::inst_ptr<PyPlan>(plan)->launch(s, t, ws_address, ws_bytes);
    } else {
      // Any other object with PyPlan's run() (a test's stand-in).
      const auto& p = launch_ptrs_;
      plan.attr(names->run)(s, key.address, p[0], y_address, p[1], p[2], p[3], p[4], p[5], p[6],
                            p[7], 0, 0, ws_address, ws_bytes, 0);
    }
    return y;
  }

 private:
  // Borrowed from `d` (a dict): the entry, None where absent; nullptr where d is not a dict.
  static PyObject* entry(PyObject* d, const nb::object& name) {
    if (!d || !PyDict_Check(d)) return nullptr;
    PyObject* v = PyDict_GetItemWithError(d, name.ptr());
    if (!v && PyErr_Occurred()) throw nb::python_error();
    return v ? v : Py_None;
  }

  static nb::object instance_dict(PyObject* o) { return take(PyObject_GenericGetDict(o, nullptr)); }

  // The layer as LinearScaleBatchNorm1d lays it out; false where it is not.
  static bool read_layer(nb::handle module, Layer& l) {
    l.dicts[0] = instance_dict(module.ptr());
    PyObject* md = l.dicts[0].ptr();
    PyObject* modules = entry(md, names->modules);
    l.gemm = entry(modules, names->gemm);
    l.bn = entry(modules, names->bn);
    if (!l.gemm || !l.bn || l.gemm == Py_None || l.bn == Py_None) return false;
    l.dicts[1] = instance_dict(l.gemm);
    l.dicts[2] = instance_dict(l.bn);
    PyObject* gp = entry(l.dicts[1].ptr(), names->parameters);
    PyObject* mp = entry(md, names->parameters);
    PyObject* bd = l.dicts[2].ptr();
    PyObject* bp = entry(bd, names->parameters);
    PyObject* bb = entry(bd, names->buffers);
    PyObject* t[kTensors] = {entry(gp, names->weight),      entry(gp, names->bias),
                             entry(mp, names->scale),       entry(bp, names->weight),
                             entry(bp, names->bias),        entry(bb, names->running_mean),
                             entry(bb, names->running_var), entry(bb, names->num_batches_tracked)};
    for (int i = 0; i < kTensors; ++i) {
      if (!t[i]) return false;
      l.tensors[i] = t[i];
    }
    const nb::object* flag_names[kFlags] = {&names->training, &names->track_running_stats,
                                            &names->momentum, &names->eps};
    for (int i = 0; i < kFlags; ++i) {
      PyObject* v = PyDict_GetItemWithError(bd, flag_names[i]->ptr());
      if (!v) {
        if (PyErr_Occurred()) throw nb::python_error();
        return false;  // not an instance attribute: the checked path reads it
      }
      l.flags[i] = v;
    }
    return true;
  }

  static bool equal(PyObject* a, PyObject* b) {
    const int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0) throw nb::python_error();
    return r == 1;
  }

  // (shape, strides, dtype, device index, address % 16[, TF32 on]) of x, and its address.
  XKey x_key(nb::handle x) const {
    XKey k;
    k.address = as_address(method0(x, names->data_ptr));
    k.shape = take(PyObject_GetAttr(x.ptr(), names->shape.ptr()));
    nb::object stride = method0(x, names->stride);
    nb::object dtype = take(PyObject_GetAttr(x.ptr(), names->dtype.ptr()));
    nb::object device = method0(x, names->get_device);
    nb::object align = nb::int_(k.address & 15);
    k.key = tf32_.is_none() ? take(PyTuple_Pack(5, k.shape.ptr(), stride.ptr(), dtype.ptr(),
                                                device.ptr(), align.ptr()))
                            : take(PyTuple_Pack(6, k.shape.ptr(), stride.ptr(), dtype.ptr(),
                                                device.ptr(), align.ptr(), call0(tf32_).ptr()));
    return k;
  }

  // Borrowed: the (plan, workspace_bytes) entry for `key`, or nullptr.
  PyObject* lookup(const nb::object& key) const {
    PyObject* got = PyDict_GetItemWithError(plans_.ptr(), key.ptr());
    if (!got && PyErr_Occurred()) throw nb::python_error();
    return got;
  }

  bool needs_grad(nb::handle x) const {
    if (!truthy(call0(grad_enabled_))) return false;
    if (truthy(take(PyObject_GetAttr(x.ptr(), names->requires_grad.ptr())))) return true;
    for (const Used& u : used_)
      if (truthy(take(PyObject_GetAttr(u.tensor.ptr(), names->requires_grad.ptr())))) return true;
    return false;
  }

  // x.new_empty(size[, dtype=dtype]): like x (device), from PyTorch's allocator.
  static nb::object new_empty(nb::handle x, const nb::object& size, nb::handle dtype) {
    if (!dtype) {
      PyObject* args[] = {x.ptr(), size.ptr()};
      return take(PyObject_VectorcallMethod(names->new_empty.ptr(), args,
                                            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
    }
    static PyObject* kwnames = nullptr;
    if (!kwnames) kwnames = PyTuple_Pack(1, names->dtype.ptr());
    if (!kwnames) throw nb::python_error();
    PyObject* args[] = {x.ptr(), size.ptr(), dtype.ptr()};
    return take(PyObject_VectorcallMethod(names->new_empty.ptr(), args,
                                          2 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames));
  }

  nb::object stream_, tf32_, autocast_, grad_enabled_, tensor_type_, byte_dtype_;
  std::size_t workspace_align_;
  std::uint64_t generation_;
  nb::object plans_;  // dict: x key -> (plan, workspace_bytes)
  nb::object gemm_, bn_;
  nb::object tensors_[kTensors];
  nb::object flags_[kFlags];
  std::vector<Used> used_;  // the args that are not None, weight first
  std::uintptr_t launch_ptrs_[kTensors] = {};
  nb::object w_shape_, w_stride_;
  long long N_ = 0;
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
  names = new Names{intern("_modules"),
                    intern("_parameters"),
                    intern("_buffers"),
                    intern("gemm"),
                    intern("bn"),
                    intern("scale"),
                    intern("weight"),
                    intern("bias"),
                    intern("running_mean"),
                    intern("running_var"),
                    intern("num_batches_tracked"),
                    intern("training"),
                    intern("track_running_stats"),
                    intern("momentum"),
                    intern("eps"),
                    intern("data_ptr"),
                    intern("dtype"),
                    intern("shape"),
                    intern("stride"),
                    intern("get_device"),
                    intern("requires_grad"),
                    intern("new_empty"),
                    intern("run")};
  m.def("forget_recorded_calls", [] { ++recorded_generation; });
  nb::class_<RecordedCall>(m, "RecordedCall")
      .def_static("make", &RecordedCall::make, nb::arg("module"), nb::arg("args"),
                  nb::arg("stream"), nb::arg("tf32").none(), nb::arg("autocast"),
                  nb::arg("grad_enabled"), nb::arg("tensor_type"), nb::arg("byte_dtype"),
                  nb::arg("workspace_align"))
      .def("matches", &RecordedCall::matches, nb::arg("module"))
      .def("add", &RecordedCall::add, nb::arg("x"), nb::arg("plan"), nb::arg("workspace_bytes"))
      .def("plan_for", &RecordedCall::plan_for, nb::arg("x"))
      .def_prop_ro("plan_count", &RecordedCall::plan_count)
      .def("replay", &RecordedCall::replay, nb::arg("module"), nb::arg("x"));
}
