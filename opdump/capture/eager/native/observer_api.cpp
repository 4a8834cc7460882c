// The native eager observer's calls from Python (opdump/capture/eager/native/path.py,
// callbacks.py, watch.py), exported as the native module's `eager_observer` submodule:
// configure, install/uninstall the RecordFunction callbacks, the probe/inert/watch settings,
// iteration boundaries (new_iteration, pause/resume), scopes, the listing and the error.
// Guarantees: called at boundaries only (no operator of the user's in flight); State `g` is
// made by the first configure() and lives for the process (callbacks may run until removed).
#include "observer_state.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>

namespace opdump {
namespace eager_observer {

State* g = nullptr;
py::object g_io_input, g_io_output, g_zero;

namespace {

// The ending iteration's seq kept for one more (observer_state.h `before`; dispatch.py's
// IterationState.before), its forward operators named now, while name_cache still holds them.
// An iteration that registered nothing (new_iteration called twice at one boundary: at install
// and at the state's change) keeps the one before.
void keep_before() {
  if (g->seq.empty()) return;
  g->before.clear();
  g->before_names.clear();
  for (const auto& e : g->seq) {
    const int64_t fi = e.second.second;
    int64_t ref = -1;
    if (fi >= 0 && static_cast<size_t>(fi) < g->name_cache.size()) {
      ref = -2 - static_cast<int64_t>(g->before_names.size());
      g->before_names.push_back(g->name_cache[static_cast<size_t>(fi)].pyname);
    }
    g->before.emplace(e.first, std::make_pair(e.second.first, ref));
  }
  g->seq.clear();
}

// ------------------------------------------------------------------ what Python calls
void configure(py::object info_cb, py::object bind_cb, py::object owner_cb, py::object slow_cb,
               py::object describe_start_cb, py::object describe_end_cb, bool dump_in, bool dump_out,
               bool capture_all) {
  if (g == nullptr) {
    g = new State();          // lives for the process (callbacks may run until removed)
    g_io_input = py::str("input");
    g_io_output = py::str("output");
    g_zero = py::int_(0);
  }
  g->info_cb = std::move(info_cb);
  g->bind_cb = std::move(bind_cb);
  g->owner_cb = std::move(owner_cb);
  g->slow_cb = std::move(slow_cb);
  g->describe_start_cb = std::move(describe_start_cb);
  g->describe_end_cb = std::move(describe_end_cb);
  g->dump_in = dump_in;
  g->dump_out = dump_out;
  g->capture_all = capture_all;
  g->watch = false;
  g->rows = py::none();
  g->failed = false;
  g->error.clear();
  g->listed.clear();          // this capture's listing (path.py pushes it whole at install)
  keep_before();              // (names from name_cache, cleared next)
  g->name_cache.clear();      // its "listed" marks were of the listed set just cleared
  g->gradients = intern("Gradients/Default");
}

// memo None: the overflow watch's install (set_watch; no rows, no statistics)
void install(py::object memo, py::object entries, py::object dtypes) {
  if (g == nullptr) throw std::runtime_error("configure() first");
  g->memo_obj = memo;
  if (memo.is_none()) {
    g->memo = nullptr;
    g->entries = py::list();
    g->dtypes = py::list();
  } else {
    g->entries = entries.cast<py::list>();
    g->dtypes = dtypes.cast<py::list>();
    g->memo = memo.cast<opdump::StatsMemo*>();
  }
  g->paused = 0;              // an earlier install's pause (uninstalled while paused) is over
  clear_in_flight();          // nothing is in flight at a boundary
  if (!g->installed) {
    g->handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                               .needsInputs(true)
                                               .needsOutputs(true)
                                               .scopes({at::RecordScope::FUNCTION}));
    g->installed = true;
  }
}

void set_probe(bool on, int64_t modes) {
  g->probe = on;
  g->modes = modes;
  g->inert = false;
}

// op_debug_mode 3 (watch.h): after configure(), before install(None, None, None)
void set_watch(py::object kind_cb, py::object bound_cb, py::object add_cb, const std::vector<std::string>& to_python) {
  opdump::watch::configure(std::move(kind_cb), std::move(bound_cb), std::move(add_cb), to_python);
  g->watch = true;
  g->dump_in = g->dump_out = false;
}

std::vector<int64_t> watch_counts() { return opdump::watch::take_counts(); }

void set_inert(bool on) {
  g->inert = on;
}

// the inert mode's __torch_dispatch__ (inert.py binds it to the mode): what reaches it is almost
// only the detach torch makes of a tensor autograd saves or unpacks while a mode is on the stack
// (TensorImpl::shallow_copy_and_detach; ~16 a step on the bench's AlexNet), forwarded here to the
// C++ operator with no Python frame (in Python: torch's dynamo-disable wrapper, the mode's method,
// the operator's call, ~10 us each); the rest goes to the mode's Python `forward` as before.
// Same result: the detach operator called through the dispatcher with the mode stashed, as
// forwarding it from Python does (inert.py's test: not ADInplaceOrView-excluded, no kwargs, a plain
// tensor argument).
PyObject* g_detach = nullptr;     // torch.ops.aten.detach.default (a reference kept for the process)
PyObject* g_plain = nullptr;      // torch.Tensor.__torch_dispatch__ (idem)
int64_t g_inert_native = 0, g_inert_python = 0;     // calls forwarded here / to `forward` (inert_counts)

py::object inert_dispatch(py::object mode, py::object func, py::object types, py::object args, py::object kwargs) {
  if (func.ptr() == g_detach && (kwargs.is_none() || (PyDict_Check(kwargs.ptr()) && PyDict_GET_SIZE(kwargs.ptr()) == 0)) &&
      PyTuple_Check(args.ptr()) && PyTuple_GET_SIZE(args.ptr()) == 1 &&
      THPVariable_CheckExact(PyTuple_GET_ITEM(args.ptr(), 0)) &&
      !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView)) {
    at::Tensor out = at::detach(THPVariable_Unpack(PyTuple_GET_ITEM(args.ptr(), 0)));
    ++g_inert_native;
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(out)));
  }
  // an operator dispatched while such a detach had the Python keys back on (observer.cpp,
  // python_keys_off): forwarded to its C++ operator (OpOverload._op) when no argument is a
  // tensor subclass with a __torch_dispatch__ of its own (what `forward` notes as a stray)
  bool plain = PyTuple_Check(types.ptr());
  for (Py_ssize_t i = 0; plain && i < PyTuple_GET_SIZE(types.ptr()); ++i) {
    PyObject* got = PyObject_GetAttrString(PyTuple_GET_ITEM(types.ptr(), i), "__torch_dispatch__");
    if (got == nullptr) PyErr_Clear();
    plain = got != nullptr && got == g_plain;
    Py_XDECREF(got);
  }
  if (plain && PyTuple_Check(args.ptr())) {
    PyObject* op = PyObject_GetAttrString(func.ptr(), "_op");
    if (op == nullptr) PyErr_Clear();
    if (op != nullptr) {
      PyObject* kw = kwargs.is_none() ? nullptr : kwargs.ptr();
      PyObject* out = PyObject_Call(op, args.ptr(), kw);
      Py_DECREF(op);
      if (out == nullptr) throw py::error_already_set();
      ++g_inert_native;
      return py::reinterpret_steal<py::object>(out);
    }
  }
  ++g_inert_python;
  return mode.attr("forward")(func, types, args, kwargs);
}

// (calls forwarded natively, calls handed to the mode's `forward`) since the last call (tests)
std::vector<int64_t> inert_counts() {
  std::vector<int64_t> out{g_inert_native, g_inert_python};
  g_inert_native = g_inert_python = 0;
  return out;
}

void set_inert_detach(py::object detach, py::object plain) {
  if (g_detach == nullptr) g_detach = detach.release().ptr();
  if (g_plain == nullptr) g_plain = plain.release().ptr();
}

void uninstall() {
  if (g != nullptr && g->installed) {
    at::removeCallback(g->handle);
    g->installed = false;
  }
}

// a new iteration: forget its per-iteration state
void new_iteration() {
  opdump::watch::new_iteration();
  keep_before();
  g->owners.clear();
  g->index = 0;
  g->names_from = 0;
  g->nonfinite.clear();
  g->rows = py::none();
  g->recorded = 0;
}

// Python code runs (pause > 0): the rows are unbound (the recorder may swap its lists)
py::tuple observer_pause() {
  ++g->paused;
  g->rows = py::none();
  // the names since the last pause: the captured operators' indices run on from names_from,
  // each named by its name_cache slot (made at its start, kept until the iteration ends)
  py::list names;
  for (int64_t i = g->names_from; i < g->index && static_cast<size_t>(i) < g->name_cache.size(); ++i)
    names.append(g->name_cache[static_cast<size_t>(i)].pyname);
  g->names_from = g->index;
  py::tuple out = py::make_tuple(names, g->nonfinite, g->recorded, g->ts);
  g->nonfinite.clear();
  g->recorded = 0;
  return out;
}

void observer_resume() {
  if (g->paused > 0) --g->paused;
}

void set_scope(py::object scope) { g->module_scope = scope.is_none() ? -1 : intern(scope.cast<std::string>()); }
void set_optimizer(py::object scope) {
  g->optimizer_scope = scope.is_none() ? -1 : intern(scope.cast<std::string>());
}
void add_listed(const std::vector<std::string>& names) {
  for (const auto& n : names) g->listed.insert(n);
}
py::object take_error() {
  if (g == nullptr || !g->failed) return py::none();
  return py::str(g->error);
}
int64_t current_index() { return g == nullptr ? 0 : g->index; }

}  // namespace
}  // namespace eager_observer
}  // namespace opdump

using namespace opdump::eager_observer;

void register_eager_observer(py::module& m) {
  auto sub = m.def_submodule("eager_observer", "native eager capture (opdump/capture/eager/native)");
  sub.attr("API") = 1;
  sub.def("configure", &configure);
  sub.def("install", &install);
  sub.def("uninstall", &uninstall);
  sub.def("set_probe", &set_probe);
  sub.def("set_inert", &set_inert);
  sub.def("set_inert_detach", &set_inert_detach);
  sub.def("inert_counts", &inert_counts);
  sub.def("inert_dispatch", &inert_dispatch, py::arg("mode"), py::arg("func"), py::arg("types"),
          py::arg("args") = py::tuple(), py::arg("kwargs") = py::none());
  sub.def("set_watch", &set_watch);
  sub.def("watch_counts", &watch_counts);
  sub.def("watch_facts", &opdump::watch::facts);
  sub.def("new_iteration", &new_iteration);
  sub.def("pause", &observer_pause);
  sub.def("resume", &observer_resume);
  sub.def("set_scope", &set_scope);
  sub.def("set_optimizer", &set_optimizer);
  sub.def("add_listed", &add_listed);
  sub.def("take_error", &take_error);
  sub.def("current_index", &current_index);
}
