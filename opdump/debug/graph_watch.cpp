// The graph-mode overflow watch's per-operator tap in C++ (op_debug_mode 3 with opdump's
// torch.compile backend; opdump/debug/overflow_graph.py, README "Debug dumps").
//
// Why: a dumped graph call runs AOTAutograd's ATen graph operator by operator, and after each
// operator the Python tap OverflowTaps.after handed its tensors to OverflowWatch.add -- ~15 us of
// Python per operator, of which almost every operator needs none: an operator whose floating
// outputs are all finite gets no verdict from opdump.debug.origin.judge, whatever its inputs.
// So the generated graph code calls this tap instead (a METH_FASTCALL builtin bound to a
// GraphWatchTaps, no pybind11 dispatch), which reads each floating CPU output's finiteness with
// finite_read (opdump/stats/finite_bound.cpp) and returns at once when all are finite; any other
// operator goes to the Python tap, called with the same arguments, exactly as without this file.
//
// What the Python watch (opdump/debug/overflow_now.py, CpuPath._add_now, called with no bound
// rules and no positional arguments by the graph tap) does without reading, done here too, from
// the kind bits overflow_graph.py gives per operator index (from opdump/debug/overflow_rules.py):
// * kAlways (ALWAYS_FINITE, no non-finite number argument): its outputs are not read, known finite;
// * kPreserving (FINITE_PRESERVING, not the `dtype` overload, no non-finite number argument):
//   every floating input known finite: its outputs are known finite, not read; some input not
//   known (never read): nothing is read -- the Python watch gives no verdict then either; some
//   input the Python watch may know as non-finite or uninitialized (below): to Python;
// * kPython (an operator that writes in place: its pre-write copies are the Python tap's; an
//   UNINITIALIZED operator type): to Python.
// Known finite: a tensor read finite whose elements cover its whole storage marks that storage
// finite at its version counter's value (a weak reference keeps the address from being reused,
// as opdump/capture/eager/native/watch.cpp does); a view of it at that version and dtype is
// known finite.  Handed to Python: every floating tensor of an operator given to the Python tap
// (its inputs and outputs not known finite here) marks its storage "Python's", whatever the
// version: the Python watch may hold a reading of it (a NaN, an on-purpose Inf, uninitialized
// memory) that a finite-preserving operator's verdict depends on, so such an operator goes to
// Python.  Both are per iteration (GraphWatch.clear at its end) and per session (one GraphWatch
// shared by its graphs: a backward reads what its forward made).
//
// Guarantees: verdicts, records and files are the Python taps' (OPDUMP_GRAPH_NATIVE_WATCH=0 keeps
// those: the parity tests compare both); closed (no dumped call in progress) the tap returns at
// once, as the Python tap does without a folder; it hands to Python anything it does not handle
// (a tensor not on the CPU, not dense, a tensor subclass, an output that is not a tensor or a
// tuple/list of tensors and Nones, a C++ error); an exception the Python tap raises propagates
// as it would from the Python tap itself.
#include <torch/extension.h>

#include <torch/csrc/autograd/python_variable.h>

#include "../stats/graph_values.h"

#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace opdump {
bool finite_read(const at::Tensor& x, double* value, bool* signed_out, bool nogil);   // stats/finite_bound.cpp
}

namespace {

namespace py = pybind11;

constexpr int kPreserving = 2, kAlways = 4, kPython = 16;   // the bits overflow_graph._native_kinds gives

bool floating(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

bool plain_storage(const at::Tensor& t) {
  return t.defined() && t.has_storage() && !t.is_inference() && t.layout() == at::kStrided &&
         !t.key_set().has(c10::DispatchKey::Python);
}

// one session's knowledge of its graphs' tensors this iteration (see the top of this file)
class GraphWatch {
 public:
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;   // keeps the address from being reused
    int64_t version;
    c10::ScalarType dtype;
    bool python;                                         // handed to Python: any version
  };

  // known finite here (same storage, version and dtype)
  bool known(const at::Tensor& t) {
    const Entry* e = entry(t);
    return e != nullptr && !e->python && e->version == t._version() && e->dtype == t.scalar_type();
  }
  // the Python watch may hold a reading of it
  bool pythons(const at::Tensor& t) {
    const Entry* e = entry(t);
    return e != nullptr && e->python;
  }
  void mark_finite(const at::Tensor& t) {
    if (!plain_storage(t) || t.storage_offset() != 0 || !t.is_non_overlapping_and_dense()) return;
    const c10::Storage& st = t.storage();
    if (static_cast<size_t>(t.numel()) * t.element_size() != st.nbytes()) return;
    auto it = map_.find(st.unsafeGetStorageImpl());
    if (it != map_.end() && it->second.python && !it->second.storage.expired()) return;   // Python's stays
    bound();
    map_.insert_or_assign(st.unsafeGetStorageImpl(), Entry{st.getWeakStorageImpl(), t._version(), t.scalar_type(), false});
  }
  void mark_python(const at::Tensor& t) {
    if (!plain_storage(t)) return;
    const c10::Storage& st = t.storage();
    bound();
    map_.insert_or_assign(st.unsafeGetStorageImpl(), Entry{st.getWeakStorageImpl(), 0, t.scalar_type(), true});
  }
  void clear() { map_.clear(); }

  int64_t read = 0, handed = 0, spared = 0;     // outputs read, operators to Python, operators not read

 private:
  const Entry* entry(const at::Tensor& t) {
    if (!plain_storage(t)) return nullptr;
    auto it = map_.find(t.storage().unsafeGetStorageImpl());
    if (it == map_.end()) return nullptr;
    if (it->second.storage.expired()) {
      map_.erase(it);
      return nullptr;
    }
    return &it->second;
  }
  void bound() {
    if (map_.size() > 100000) map_.clear();      // bounded (cleared every iteration anyway)
  }
  std::unordered_map<const c10::StorageImpl*, Entry> map_;
};

// the taps of one graph (overflow_graph.OverflowTaps makes one when the module has this class)
class GraphWatchTaps {
 public:
  // python_after: a weakref.WeakMethod of the Python tap (the graph's code keeps its object alive;
  // a strong reference here would make a cycle through C++ the garbage collector cannot see)
  GraphWatchTaps(py::object watch, std::vector<int> kinds, py::object python_after)
      : watch_obj_(std::move(watch)), watch_(watch_obj_.cast<GraphWatch*>()), kinds_(std::move(kinds)),
        python_after_(std::move(python_after)) {}

  // a dumped call starts (`native` false: every operator to the Python tap) / ends
  void open(bool native) { state_ = native ? kNative : kAllPython; }
  void close() { state_ = kClosed; }

  // after(index, inputs, value) as a builtin bound to `owner` (this object's Python instance)
  static py::object fast(py::object owner) {
    static PyMethodDef def = {
        "after", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&GraphWatchTaps::fast_after)),
        METH_FASTCALL, "tap(index, inputs, value): an operator's tensors, after it ran"};
    GraphWatchTaps* self = owner.cast<GraphWatchTaps*>();
    if (self == nullptr || self_of(owner.ptr()) != self) return py::none();
    PyObject* f = PyCFunction_New(&def, owner.ptr());
    if (f == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(f);
  }

 private:
  enum State { kClosed, kNative, kAllPython };   // (not kPython: the kind bit above)

  static GraphWatchTaps* self_of(PyObject* owner) {
    auto* inst = reinterpret_cast<py::detail::instance*>(owner);
    return inst->get_value_and_holder(nullptr, false).value_ptr<GraphWatchTaps>();
  }

  // a plain torch.Tensor or Parameter on the CPU (anything else: the Python tap's)
  static bool plain(PyObject* item) {
    if (!THPVariable_CheckExact(item)) {
      static PyObject* const parameter = [] {
        py::object p = py::module_::import("torch").attr("nn").attr("Parameter");
        return p.release().ptr();          // kept for the process's life
      }();
      if (reinterpret_cast<PyObject*>(Py_TYPE(item)) != parameter) return false;
    }
    const at::Tensor& t = THPVariable_Unpack(item);
    return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
           !t.key_set().has(c10::DispatchKey::Python);
  }

  static bool counts(const at::Tensor& t) { return floating(t.scalar_type()) && t.numel() > 0; }

  // true: the operator is done (no verdict possible); false: the Python tap takes it
  bool native(int64_t index, PyObject* inputs, PyObject* value) {
    if (index < 0 || static_cast<size_t>(index) >= kinds_.size()) return false;
    const int kind = kinds_[static_cast<size_t>(index)];
    if (kind & kPython) return false;
    PyObject* const* ins;
    Py_ssize_t nin;
    if (PyList_Check(inputs) || PyTuple_Check(inputs)) {
      ins = PySequence_Fast_ITEMS(inputs);
      nin = PySequence_Fast_GET_SIZE(inputs);
    } else {
      return false;
    }
    PyObject* const* outs;
    Py_ssize_t nout;
    if (!opdump::output_items(&value, &outs, &nout)) return false;
    for (Py_ssize_t k = 0; k < nin; ++k)
      if (ins[k] != Py_None && !plain(ins[k])) return false;
    for (Py_ssize_t k = 0; k < nout; ++k)
      if (outs[k] != Py_None && !plain(outs[k])) return false;
    GraphWatch& w = *watch_;
    if (kind & kAlways) {
      for (Py_ssize_t k = 0; k < nout; ++k)
        if (outs[k] != Py_None && counts(THPVariable_Unpack(outs[k]))) w.mark_finite(THPVariable_Unpack(outs[k]));
      ++w.spared;
      return true;
    }
    if (kind & kPreserving) {
      bool any = false, all = true;
      for (Py_ssize_t k = 0; k < nin; ++k) {
        if (ins[k] == Py_None) continue;
        const at::Tensor& t = THPVariable_Unpack(ins[k]);
        if (!counts(t)) continue;
        if (w.pythons(t)) return false;
        any = true;
        all = all && w.known(t);
      }
      if (any) {              // no floating input: its outputs are read, as the Python watch does
        if (all)
          for (Py_ssize_t k = 0; k < nout; ++k)
            if (outs[k] != Py_None && counts(THPVariable_Unpack(outs[k]))) w.mark_finite(THPVariable_Unpack(outs[k]));
        ++w.spared;
        return true;
      }
    }
    for (Py_ssize_t k = 0; k < nout; ++k) {
      if (outs[k] == Py_None) continue;
      const at::Tensor& t = THPVariable_Unpack(outs[k]);
      if (!counts(t) || w.known(t)) continue;
      double v = 0.0;
      bool is_signed = false;
      if (!opdump::finite_read(t, &v, &is_signed, true)) return false;    // not dense: Python reads it
      ++w.read;
      if (!std::isfinite(v)) return false;
      w.mark_finite(t);
    }
    return true;
  }

  // after the Python tap judged it: the operator's tensors not known finite are Python's
  void handed(PyObject* inputs, PyObject* value) {
    GraphWatch& w = *watch_;
    ++w.handed;
    auto one = [&w](PyObject* item) {
      if (item == nullptr || !THPVariable_Check(item)) return;
      const at::Tensor& t = THPVariable_Unpack(item);
      if (t.defined() && counts(t) && !w.known(t)) w.mark_python(t);
    };
    auto each = [&one](PyObject* seq) {
      if (THPVariable_Check(seq)) {
        one(seq);
      } else if (PyList_Check(seq) || PyTuple_Check(seq)) {
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); ++k) one(PySequence_Fast_ITEMS(seq)[k]);
      }
    };
    each(inputs);
    each(value);
  }

  static PyObject* fast_after(PyObject* owner, PyObject* const* args, Py_ssize_t nargs) {
    GraphWatchTaps* self = self_of(owner);
    if (self == nullptr || self->state_ == kClosed) Py_RETURN_NONE;
    py::object keep_after = self->python_after_, keep_watch = self->watch_obj_;   // held for the call
    if (self->state_ == kNative && nargs == 3 && PyLong_CheckExact(args[0])) {
      bool done = false;
      try {
        const long long index = PyLong_AsLongLong(args[0]);
        if (!(index == -1 && PyErr_Occurred())) done = self->native(index, args[1], args[2]);
      } catch (py::error_already_set& e) {
        e.restore();
        done = false;
      } catch (...) {
        done = false;
      }
      if (PyErr_Occurred()) PyErr_Clear();
      if (done) Py_RETURN_NONE;
    }
    PyObject* method = PyObject_CallNoArgs(keep_after.ptr());     // the WeakMethod's bound method
    if (method == nullptr) return nullptr;
    if (method == Py_None) return method;         // its object is gone: nothing to watch
    PyObject* r = PyObject_Vectorcall(method, args, static_cast<size_t>(nargs), nullptr);
    Py_DECREF(method);
    if (r == nullptr) return nullptr;             // as the Python tap itself raised it
    if (nargs == 3) {
      try {
        self->handed(args[1], args[2]);
      } catch (py::error_already_set& e) {
        e.restore();
        PyErr_Clear();
      } catch (...) {
      }
    }
    return r;
  }

  py::object watch_obj_;
  GraphWatch* watch_;
  std::vector<int> kinds_;
  py::object python_after_;
  State state_ = kClosed;
};

}  // namespace

void register_graph_watch(py::module& m) {
  py::class_<GraphWatch>(m, "GraphWatch")
      .def(py::init<>())
      .def("clear", &GraphWatch::clear, "forget what is known (an iteration ended)")
      .def("counts", [](GraphWatch& w) { return py::make_tuple(w.read, w.handed, w.spared); },
           "(outputs read, operators handed to the Python tap, operators not read) so far");
  py::class_<GraphWatchTaps> taps(m, "GraphWatchTaps");
  taps.def(py::init<py::object, std::vector<int>, py::object>(), py::arg("watch"), py::arg("kinds"),
           py::arg("python_after"))
      .def("open", &GraphWatchTaps::open, py::arg("native"))
      .def("close", &GraphWatchTaps::close)
      .def("fast", [](py::object self) { return GraphWatchTaps::fast(self); },
           "after() as a builtin called without pybind11's dispatch, or None");
  taps.attr("graph_tap") = true;     // opdump.capture.graph.instrument.uninstrument removes its calls
}
