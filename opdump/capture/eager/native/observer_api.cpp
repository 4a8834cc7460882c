// The native eager observer's calls from Python (opdump/capture/eager/native/path.py,
// callbacks.py, watch.py), exported as the native module's `eager_observer` submodule:
// configure, install/uninstall the RecordFunction callbacks, the probe/inert/watch settings,
// iteration boundaries (new_iteration, pause/resume), scopes, the listing and the error.
// Guarantees: called at boundaries only (no operator of the user's in flight); State `g` is
// made by the first configure() and lives for the process (callbacks may run until removed).
#include "observer_state.h"

namespace opdump {
namespace eager_observer {

State* g = nullptr;
py::object g_io_input, g_io_output, g_zero;

namespace {

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

void uninstall() {
  if (g != nullptr && g->installed) {
    at::removeCallback(g->handle);
    g->installed = false;
  }
}

// a new iteration: forget its per-iteration state
void new_iteration() {
  opdump::watch::new_iteration();
  g->seq.clear();
  g->owners.clear();
  g->index = 0;
  g->names = py::list();
  g->all_names.clear();
  g->nonfinite.clear();
  g->rows = py::none();
  g->recorded = 0;
}

// Python code runs (pause > 0): the rows are unbound (the recorder may swap its lists)
py::tuple observer_pause() {
  ++g->paused;
  g->rows = py::none();
  py::tuple out = py::make_tuple(g->names, g->nonfinite, g->recorded, g->ts);
  g->names = py::list();
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
