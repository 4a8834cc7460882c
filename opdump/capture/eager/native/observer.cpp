// The native eager observer: operators seen from C++ (RecordFunction callbacks), named and
// recorded as statistic.csv rows with no Python per operator.
//
// What it sees (README, "Eager mode", native statistics path): exactly the operators the
// Python capture's dispatch mode sees, i.e. the calls that would reach the Python dispatch
// key:
// * a call whose kernel for CPU autograd is the CompositeImplicitAutograd decomposition (read
//   from the computed dispatch table) is not an operator of its own (its children are); nor is
//   detach_ (its autograd kernel never redispatches);
// * a call made with the Python key excluded (torch.tensor()'s own empty/copy) never reaches
//   a mode;
// * a call made while another such operator runs is dropped when it comes from that
//   operator's kernel (below autograd: the TLS excluded set then holds the autograd
//   functionality, which the enclosing operator's start did not have, or had already:
//   inference mode);
// * a call made by an enclosing operator's autograd kernel (above the Python key) would be
//   seen by the dispatch mode *before* the enclosing one: that order is not rebuilt here, so
//   it is an error (path.py: met in the probe, the native path is never used; met in a served
//   iteration, that iteration is dropped).
// Probe (path.py): beside the Python capture's dispatch mode, names only, and a call made
// while the mode handles an operator (the mode is off the stack then) is ignored.
// Names, scopes (module stack pushed from Python at module boundaries, autograd sequence
// numbers for backward operators, the optimizer), the per-iteration index and the rows
// follow opdump/capture/eager/dispatch.py; an operator whose name is not in the listing is
// described by one call into Python (describe_start/describe_end); a tensor the native
// statistics memo does not take goes to the Python recorder (slow_record).
//
// Overflow watch (op_debug_mode 3, set_watch): no rows; each captured operator goes to
// watch.cpp (a hook at its start and its end), which reads its outputs' finiteness and hands
// to Python only the operators the watch must judge.
// Guarantees: a callback never throws; any failure (a C++ exception, a Python error in a
// call back) turns the observer off and keeps the message, which Python reads at the next
// boundary (take_error) and turns into one warning.
//
// Files (split by job; this one keeps the callbacks): observer_state.h (the shared state),
// observer_names.cpp (scopes and names), observer_args.cpp (values as Python sees them),
// observer_rows.cpp (the rows), observer_api.cpp (what Python calls); watch.cpp (the watch).
#include "observer_state.h"   // first: it sets NDEBUG before any torch header (see there)

#include <ATen/SequenceNumber.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>

#include <limits>
#include <optional>

namespace opdump {
namespace eager_observer {
namespace {

thread_local std::vector<Ctx*> t_candidates;
thread_local bool t_inside = false;     // in our own callback (ops it runs are not the user's)

void fail(const std::string& why) {
  if (!g->failed) {
    g->failed = true;
    g->error = why;
  }
}

// a callback's body: t_inside set while it runs (the operators it calls are opdump's own) and
// reset on every way out; a C++ exception or a Python error turns the observer off (fail)
// instead of leaving the callback
template <typename Body>
void guarded(Body&& body) {
  t_inside = true;
  try {
    body();
  } catch (py::error_already_set& e) {
    fail(std::string("Python: ") + e.what());
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("unknown C++ exception");
  }
  t_inside = false;
}

bool autograd_input(c10::ArrayRef<c10::IValue> inputs) {
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      if (v.toTensor().defined() && v.toTensor().key_set().has(c10::DispatchKey::AutogradFunctionality)) return true;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList())
        if (t.defined() && t.key_set().has(c10::DispatchKey::AutogradFunctionality)) return true;
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined() &&
            e.toTensor().key_set().has(c10::DispatchKey::AutogradFunctionality)) return true;
    }
  }
  return false;
}

// served iterations (path.py's inert mode on the stack): the Python dispatch keys stay off the
// thread's included set, so that operators do not reach the mode; a mode handling a detach (an
// autograd node saving/unpacking an output) pushes it back on the stack afterwards, which turns
// them on again: off again at the next callback (the operator whose keys were computed before
// reaches the inert mode, which forwards it)
// true when they were on (the operator starting now was dispatched with them: it reaches the mode)
inline bool python_keys_off() {
  if (g->inert) {
    const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
    if (included.has(c10::DispatchKey::Python) || included.has(c10::DispatchKey::PythonTLSSnapshot)) {
      c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Python, false);
      c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::PythonTLSSnapshot, false);
      return true;
    }
  }
  return false;
}

// a tensor argument carrying a Python dispatch key (a subclass with its own __torch_dispatch__):
// the call goes to Python's fallback, which must find the mode enabled
bool python_input(c10::ArrayRef<c10::IValue> inputs) {
  const c10::DispatchKeySet python(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
  auto has = [&](const at::Tensor& t) { return t.defined() && (t.key_set() & python).empty() == false; };
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      if (has(v.toTensor())) return true;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) if (has(t)) return true;
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) if (e.isTensor() && has(e.toTensor())) return true;
    }
  }
  return false;
}

// served iterations: the Python key is excluded from a candidate's start to its end.  Why: with a
// dispatch mode on the stack (the inert one) and the Python key not excluded, every tensor
// autograd saves as an operator's output, and every such tensor unpacked later, is detached
// through the mode (TensorImpl::shallow_copy_and_detach calls the mode's Python detach): ~20 us of
// Python each, ~40 a step on AlexNet.  Inside an operator (below its RecordFunction: its autograd
// kernel saving its outputs, its kernel) the Python capture's mode sees nothing of that detach
// (dispatch.observation_only drops it) and the kernel itself runs with the mode popped, i.e. with
// no mode enabled, as it does here with the key excluded; a composite operator's branches
// (isTensorSubclassLike: linear, reshape), taken above any candidate, still see the mode.  Saved
// outputs unpacked by backward nodes still detach through the mode (a node's formula branches on
// the mode: no window to exclude it in).  Not for a call dispatched to the Python key (the keys
// back on after such a detach, python_keys_off; a tensor subclass's argument): Python's fallback
// then runs the mode, which it must find enabled.
inline void exclude_python(Ctx* c, const at::RecordFunction& fn, bool python_dispatched) {
  if (g->inert && !g->probe && !python_dispatched && !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python) &&
      !python_input(fn.inputs())) {
    c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey::Python, true);
    c->python_off = true;
  }
}

inline void include_python(Ctx* c) {
  if (c->python_off) {
    c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey::Python, false);
    c->python_off = false;
  }
}

// op_debug_mode 3 (watch.h), at a captured operator's start (GIL not needed: decide and prove
// take it to call Python): keep its inputs, copy what it writes unless Python's rule says it
// cannot be an origin
void watch_start(const at::RecordFunction& fn, Ctx* c, c10::ArrayRef<c10::IValue> inputs) {
  opdump::watch::InFlight& w = c->watch;
  w.kind = opdump::watch::decide(c->ov, c->ov->op_type_s, fn.name(), fn.overload_name(), inputs,
                                 [&] { return python_args(fn, inputs); });
  if (w.kind & opdump::watch::kPython) {
    w.kind = 0;
    w.to_python = true;
  } else if (w.kind & opdump::watch::kPreserving) {
    w.inputs_known = opdump::watch::inputs_finite(inputs);
  }
  bool copy = !c->written.empty() && (w.kind & opdump::watch::kCopy);
  if (copy && (w.kind & opdump::watch::kBounded)) {    // proven finite before the write: no copy
    std::vector<c10::optional<at::Tensor>> outs(c->written.begin(), c->written.end());
    w.written_at_start = true;
    copy = !opdump::watch::prove(w, fn.name(), fn.overload_name(), inputs, outs,
                                 [&] { return python_args(fn, inputs); });
  }
  opdump::watch::start(w, inputs, c->written, copy);
}

// ... at its end (GIL not held): its floating outputs read; Python sees it only when one is not
// finite (or unread), and a new operator's description
void watch_end(const at::RecordFunction& fn, Ctx* c) {
  std::vector<c10::optional<at::Tensor>> outs = outputs_of(fn, c);
  opdump::watch::InFlight& w = c->watch;
  const bool describe = c->describe && !c->describe.is_none();
  bool fine = false;
  constexpr double unknown = std::numeric_limits<double>::quiet_NaN();
  if (w.to_python) {
  } else if (w.proven) {
    opdump::watch::known_outputs(outs, w.b, w.l);    // bounded by the magnitude rules: no reading
    fine = true;
  } else if ((w.kind & opdump::watch::kAlways) || ((w.kind & opdump::watch::kPreserving) && w.inputs_known)) {
    opdump::watch::known_outputs(outs, unknown, unknown);      // finite by Python's rules: no reading
    fine = true;
  } else {
    if ((w.kind & opdump::watch::kBounded) && !w.written_at_start) {
      py::gil_scoped_acquire gil;
      fine = opdump::watch::prove(w, fn.name(), fn.overload_name(), w.inputs, outs,
                                  [&] { return python_args(fn, w.inputs); });
      if (fine) opdump::watch::known_outputs(outs, w.b, w.l);
    }
    if (!fine) fine = opdump::watch::finite(outs);
  }
  if (fine && !describe) {
    opdump::watch::recycle(w);
    return;
  }
  py::gil_scoped_acquire gil;
  if (describe) {
    at::RecordFunctionGuard off(false);     // the description's torch calls are opdump's own
    py::list items;
    for (const auto& t : outs) items.append(t ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*t)) : py::none());
    g->describe_end_cb(c->describe, items);
    c->describe = py::object();
  }
  if (fine) {
    opdump::watch::recycle(w);
    return;
  }
  std::vector<c10::optional<at::Tensor>> flat_in;
  for (const c10::IValue& v : w.inputs) flat(v, flat_in);
  py::list values = python_args(fn, w.inputs);
  opdump::watch::hand_over(w, c->index, g->name_cache[static_cast<size_t>(c->index)].pyname, fn.name(),
                           fn.overload_name(), values, flat_in, outs);
}

}  // namespace

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (g == nullptr) return nullptr;
  const bool python_dispatched = python_keys_off();
  if (g->paused || g->failed || t_inside) return nullptr;
  // a call made while a dispatch mode of ours handles an operator (the mode is off its stack
  // then: the Python capture's own call of the operator and opdump's work in the probe; the
  // detach of an output an autograd node saves, which plain eager makes with no dispatcher call,
  // under the probe's mode or the inert one, path.py) is none of the user's
  if (static_cast<int64_t>(c10::impl::TorchDispatchModeTLS::stack_len()) < g->modes) return nullptr;
  // a call that is no candidate gets no context (on_end is handed nullptr: nothing to do)
  std::unique_ptr<Ctx> ctx;
  guarded([&] {
    const c10::DispatchKeySet tls_excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
    // a call made with the Python key excluded (torch.tensor()'s own empty/copy/detach_) never
    // reaches a dispatch mode: not an operator the Python capture sees (unless the exclusion is
    // ours, exclude_python: such a call is judged below as under the Python capture's mode)
    if (tls_excluded.has(c10::DispatchKey::Python) && (t_candidates.empty() || !t_candidates.back()->python_off)) {
      return;
    }
    // the autograd functionality bit (AutoDispatchBelowADInplaceOrView and inference mode exclude
    // it with no backend bit: has(AutogradCPU) would ask for the CPU bit too)
    const bool excluded = tls_excluded.has(c10::DispatchKey::AutogradFunctionality);
    if (!t_candidates.empty()) {
      Ctx* outer = t_candidates.back();
      if (outer->excluded || excluded) {    // from the enclosing operator's kernel
        return;
      }
    }
    Overload* ov = overload_of(fn);
    if (ov->cia) {
      return;
    }
    ctx = std::make_unique<Ctx>();
    ctx->excluded = excluded;
    if (!t_candidates.empty()) {   // called by an enclosing operator's autograd kernel
      fail(std::string("an operator (") + (t_candidates.back()->opname ? t_candidates.back()->opname : "?") + ") called " + fn.name() + " above autograd: its order cannot be rebuilt natively");
      ctx.reset();
      return;
    }
    ctx->candidate = true;
    ctx->opname = fn.name();
    // a call with no tensor carrying the autograd key (a factory: zeros, full…) runs no autograd
    // kernel: everything it calls comes from its kernel, below where a mode would have seen it
    if (!ctx->excluded && !autograd_input(fn.inputs())) ctx->excluded = true;
    ctx->ov = ov;
    t_candidates.push_back(ctx.get());
    // where it runs (dispatch.py OperatorPath._phase)
    auto node = torch::autograd::get_current_node();
    int scope = -1;
    int64_t forward_index = -1;
    Phase phase;
    if (node) {
      if (node->name().rfind("CompiledFunction", 0) == 0) {
        return;
      }
      phase = kBackward;
      scope = backward_scope(node.get(), &forward_index);
    } else if (g->optimizer_scope >= 0) {
      phase = kOptimizer;
      scope = g->optimizer_scope;
    } else if (g->module_scope >= 0) {
      phase = kModule;
      scope = g->module_scope;
    } else if (g->capture_all) {
      phase = kOutside;
      scope = intern("Default");
    } else {
      ctx->top = true;
      return;
    }
    if (!ov->is_op) {
      return;
    }
    // the watch's served iteration (no rows) takes the GIL only where Python is called: the
    // iteration's binding, a new name, a new operator's description, a rule asked (watch_start).
    // Why: a forward operator called from Python runs with the GIL released, so holding it here
    // costs a hand-over per operator (and one to the writer thread waiting on it)
    std::optional<py::gil_scoped_acquire> gil;
    if (!g->watch || g->probe) gil.emplace();
    if (!g->rows || g->rows.is_none()) {     // bound()'s own test, without the GIL
      if (!gil) gil.emplace();
      if (!bound()) {
        return;
      }
    }
    ctx->captured = true;
    ctx->phase = static_cast<int>(phase);
    ctx->scope = scope;
    ctx->index = g->index++;
    NameSlot* known = nullptr;      // the index's name, made in an earlier iteration and listed
    if (static_cast<size_t>(ctx->index) < g->name_cache.size()) {
      NameSlot& s = g->name_cache[static_cast<size_t>(ctx->index)];
      if (s.scope == scope && s.ov == ov && s.pyname && s.listed) known = &s;
    }
    if (known == nullptr && !gil) gil.emplace();
    NameSlot& slot = known != nullptr ? *known : name_slot(scope, ov, ctx->index);
    const std::string& name = slot.name;
    if (!slot.listed) slot.listed = g->listed.count(name) > 0;
    const bool listed = slot.listed;
    auto inputs = fn.inputs();
    if (listed && !g->probe) {
      for (const c10::IValue& v : inputs) {
        if (nonfinite_scalar(v)) {
          g->nonfinite.push_back(name);
          break;
        }
      }
    }
    // its name is name_cache[index]'s until the iteration ends: pause() hands them over
    if (!g->watch) ctx->name = slot.pyname;    // the watch takes it from name_cache when it needs it
    if (!listed && !g->probe) {
      if (!gil) gil.emplace();
      py::list args = python_args(fn, inputs);
      py::object var = py::none();
      if (node) {
        if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
          if (acc->variable.defined()) var = py::reinterpret_steal<py::object>(THPVariable_Wrap(acc->variable));
        }
      }
      ctx->describe = g->describe_start_cb(ctx->index, ov->op_type, py::str(fn.overload_name()),
                                           py::str(g->scopes[scope]), static_cast<int>(phase),
                                           forward_name(forward_index),
                                           var, py::str(fn.name()), args);
      g->listed.insert(name);
      slot.listed = true;
    }
    if (g->probe) {     // names only: the Python capture records this iteration
      return;
    }
    std::vector<c10::optional<at::Tensor>> flat_in;
    if (g->dump_in || ov->writes_list) {
      for (const c10::IValue& v : inputs) flat(v, flat_in);
    }
    if (ov->writes_list) {
      for (auto& t : flat_in) ctx->written.push_back(*t);
    } else {
      for (int pos : ov->written) {
        if (pos < static_cast<int>(inputs.size())) {
          std::vector<c10::optional<at::Tensor>> w;
          flat(inputs[pos], w);
          for (auto& t : w) ctx->written.push_back(*t);
        }
      }
    }
    if (g->watch) {
      watch_start(fn, ctx.get(), inputs);
      return;
    }
    if (g->dump_in) record(ctx.get(), 0, g_io_input, flat_in);
  });
  if (ctx) exclude_python(ctx.get(), fn, python_dispatched);
  return ctx;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (g == nullptr) return;
  python_keys_off();
  if (raw == nullptr) return;
  Ctx* c = static_cast<Ctx*>(raw);
  include_python(c);
  if (!c->candidate) return;
  if (!t_candidates.empty() && t_candidates.back() == c) t_candidates.pop_back();
  if (g->failed || t_inside) return;
  guarded([&] {
    const int64_t seqnr = static_cast<int64_t>(at::sequence_number::peek()) - 1;
    if (c->top) {
      g->seq.emplace(seqnr, std::make_pair(intern("Default"), static_cast<int64_t>(-1)));
    } else if (c->captured) {
      if (c->phase <= kModule) {   // forward (dispatch.py: phase <= Phase.MODULE)
        g->seq.emplace(seqnr, std::make_pair(c->scope, c->index));
      }
      if (g->probe) {
        py::gil_scoped_acquire gil;
        c->name = py::object();
        return;
      }
      if (g->watch) {
        watch_end(fn, c);
        return;
      }
      py::gil_scoped_acquire gil;
      if (g->memo != nullptr) for (const at::Tensor& t : c->written) g->memo->forget(t);
      std::vector<c10::optional<at::Tensor>> outs;
      if (g->dump_out || (c->describe && !c->describe.is_none())) outs = outputs_of(fn, c);
      if (g->dump_out) record(c, 1, g_io_output, outs);
      if ((c->describe && !c->describe.is_none())) {
        at::RecordFunctionGuard off(false);     // the description's torch calls are opdump's own
        py::list items;
        for (const auto& t : outs) items.append(t ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*t)) : py::none());
        g->describe_end_cb(c->describe, items);
        c->describe = py::object();
      }
      c->name = py::object();
    }
  });
}

void clear_in_flight() { t_candidates.clear(); }

}  // namespace eager_observer
}  // namespace opdump
