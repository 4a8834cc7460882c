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
// libtorch is built with NDEBUG, and at::RecordFunction has a member only without it: this file
// must see the class as libtorch does (its other members' offsets), whatever the build's flags.
#ifndef NDEBUG
#define NDEBUG 1
#endif
#include <torch/extension.h>

#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../../../stats/contract.h"
#include "../../../stats/stats_memo.h"
#include "watch.h"

namespace {

namespace py = pybind11;
using namespace opdump::contract;

enum Phase { kOutside = 0, kModule = 1, kBackward = 2, kOptimizer = 3 };

struct Overload {
  bool cia = false;              // runs its CompositeImplicitAutograd decomposition: its children are the operators
  bool is_op = false;            // dumped as an operator (schema facts say so)
  py::object op_type;            // Python str
  std::string op_type_s;
  std::vector<int> written;      // argument positions it writes
  bool writes_list = false;
  bool mutated = false;          // returns nothing: the written arguments are its outputs
};

struct PairHash {
  size_t operator()(const std::pair<const void*, const void*>& p) const {
    return std::hash<const void*>()(p.first) * 31 + std::hash<const void*>()(p.second);
  }
};

struct Ctx : at::ObserverContext {
  bool candidate = false;        // would reach the Python key
  bool excluded = false;         // ADInplaceOrView excluded at its start
  bool captured = false;         // named and recorded
  bool top = false;              // a candidate outside everything (its sequence number -> Default)
  const char* opname = nullptr;
  int phase = -1;
  Overload* ov = nullptr;
  int scope = -1;
  int64_t index = -1;
  py::object name;
  py::object describe;           // the OpInfo Python is describing (new operators)
  std::vector<at::Tensor> written;
  opdump::watch::InFlight watch; // op_debug_mode 3 (watch.h)

  ~Ctx() override {
    if (name || describe) {    // Python objects are released under the GIL
      py::gil_scoped_acquire gil;
      name = py::object();
      describe = py::object();
    }
  }
};

// what an operator index of the last iterations was named (a served program runs the same
// operators every iteration: its names, listing lookups and shape texts are made once)
struct ShapeText {
  std::vector<int64_t> sizes;
  int64_t itemsize = -1;
  py::object shape, nbytes;      // the row's shape text and byte count
};

struct NameSlot {
  int scope = -1;
  const Overload* ov = nullptr;
  std::string name;
  py::object pyname;
  bool listed = false;           // known listed (the listed set only grows until configure() clears both)
  std::vector<ShapeText> shapes[2];   // per side (input, output), per slot
};

thread_local std::vector<Ctx*> t_candidates;
thread_local bool t_inside = false;     // in our own callback (ops it runs are not the user's)

struct State {
  bool installed = false;
  at::CallbackHandle handle = 0;
  int paused = 0;
  bool failed = false;
  std::string error;
  // settings
  bool dump_in = true, dump_out = true, capture_all = false;
  bool probe = false;            // names only, beside the Python capture (path.py: the probe iteration)
  int64_t modes = 0;             // the dispatch modes of ours on the stack (the probe's, or the inert one)
  bool inert = false;            // serving: the inert mode is on the stack (python_keys_off)
  bool watch = false;            // op_debug_mode 3: no rows; outputs read for finiteness (watch.h)
  // Python call-backs
  py::object bind_cb, info_cb, owner_cb, slow_cb, describe_start_cb, describe_end_cb;
  // the iteration: rows, statistics batch
  py::object rows;               // the recorder's list for the iteration's folder (None: unbound)
  py::object memo_obj;
  opdump::StatsMemo* memo = nullptr;
  py::list entries, dtypes;      // the statistics batch's own lists (DeviceStatsBatch._entries/_dtypes)
  int64_t ts = 0, recorded = 0;
  // scopes
  std::vector<std::string> scopes;
  std::unordered_map<std::string, int> scope_ids;
  int module_scope = -1, optimizer_scope = -1;
  std::unordered_map<int64_t, std::pair<int, int64_t>> seq;   // seq nr -> (forward scope, forward index)
  std::vector<int> gradient_of;  // scope id -> id of "Gradients/<scope>" (-1: not yet)
  std::vector<py::object> all_names;                           // this iteration's names so far (Python str)
  std::unordered_map<const c10::TensorImpl*, int> owners;   // parameter -> scope (this iteration)
  std::unordered_set<std::string> listed;
  int64_t index = 0;
  py::list names;                // names since the last pause (Python str)
  std::vector<NameSlot> name_cache;   // per operator index (see NameSlot)
  std::vector<std::string> nonfinite;                          // listed operators seen with an Inf/NaN scalar
  std::unordered_map<std::pair<const void*, const void*>, std::unique_ptr<Overload>, PairHash> overloads;
  int gradients = -1;            // scope id of "Gradients/Default"
};

State* g = nullptr;
py::object g_io_input, g_io_output, g_zero;

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

int intern(const std::string& s) {
  auto it = g->scope_ids.find(s);
  if (it != g->scope_ids.end()) return it->second;
  int id = static_cast<int>(g->scopes.size());
  g->scopes.push_back(s);
  g->scope_ids.emplace(s, id);
  return id;
}

Overload* overload_of(const at::RecordFunction& fn) {
  auto key = std::make_pair(static_cast<const void*>(fn.name()), static_cast<const void*>(fn.overload_name()));
  auto it = g->overloads.find(key);
  if (it != g->overloads.end()) return it->second.get();
  auto ov = std::make_unique<Overload>();
  auto opname = fn.operator_name();
  if (opname) {
    auto handle = c10::Dispatcher::singleton().findOp(*opname);
    bool cia = false;
    if (handle) {     // the kernel CPU autograd dispatches to is the decomposition ("[math kernel]")
      const std::string table = handle->dumpComputedTable();
      const size_t at = table.find("\nAutogradCPU:");
      if (at != std::string::npos) {
        const size_t end = table.find('\n', at + 1);
        cia = table.substr(at, end == std::string::npos ? std::string::npos : end - at).find("[math kernel]") !=
              std::string::npos;
      }
    }
    // detach_'s autograd kernel (VariableTypeManual.cpp) does the whole work and never
    // redispatches: a dispatch mode never sees it (torch.tensor() calls it after lift_fresh)
    if (opname->name == "aten::detach_") cia = true;
    ov->cia = cia;
    if (!cia) {
      py::gil_scoped_acquire gil;
      py::object got = g->info_cb(opname->name, opname->overload_name);
      if (!got.is_none()) {
        auto t = got.cast<py::tuple>();
        ov->is_op = true;
        ov->op_type = t[0];
        ov->op_type_s = t[0].cast<std::string>();
        ov->written = t[1].cast<std::vector<int>>();
        ov->writes_list = t[2].cast<bool>();
        ov->mutated = t[3].cast<bool>();
      }
    }
  }
  else {
    ov->cia = true;    // not an operator call: transparent
  }
  Overload* raw = ov.get();
  g->overloads.emplace(key, std::move(ov));
  return raw;
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

// a Python number torch wrapped into a 0-d tensor (mul_(2.0)): a dispatch mode receives the number
bool wrapped_number(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number();
}

// an argument as a dispatch mode receives it (torch's parseIValuesToPyArgsKwargs: dtype, layout and
// memory format arguments, ints in the IValue, become their Python objects)
py::object to_python(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) return py::none();
  if (wrapped_number(v)) return torch::jit::toPyObject(c10::IValue(v.toTensor().item()));
  c10::TypePtr t = arg.real_type();
  if (t->kind() == c10::OptionalType::Kind) t = t->castRaw<c10::OptionalType>()->getElementType();
  if (v.isInt()) {
    if (t->kind() == c10::ScalarTypeType::Kind) {
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
    }
    if (t->kind() == c10::LayoutType::Kind) {
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
    }
    if (t->kind() == c10::MemoryFormatType::Kind) {
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
    }
  }
  return torch::jit::toPyObject(v);
}

// the value of a floating wrapped number (a Python float torch made a 0-d CPU tensor of, double
// as a rule), read in place: item() is two dispatcher calls, ~90 a step on the bench's decoder
double wrapped_double(const at::Tensor& t) {
  if (t.device().is_cpu()) {
    switch (t.scalar_type()) {
      case at::kDouble: return *t.const_data_ptr<double>();
      case at::kFloat: return static_cast<double>(*t.const_data_ptr<float>());
      default: break;
    }
  }
  return t.item().toDouble();
}

// the arguments as a dispatch mode receives them, in schema order (GIL held)
py::list python_args(const at::RecordFunction& fn, c10::ArrayRef<c10::IValue> inputs) {
  py::list args;
  const auto schema = fn.operator_schema();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (schema && i < schema->arguments().size()) args.append(to_python(schema->arguments()[i], inputs[i]));
    else args.append(torch::jit::toPyObject(inputs[i]));
  }
  return args;
}

bool nonfinite_scalar(const c10::IValue& v) {
  auto bad = [](double x) {
    double a = std::fabs(x);
    return x != x || std::isinf(x) || a == 65504.0 || a == 3.3895313892515355e+38 || a == 3.4028234663852886e+38 ||
           a == 1.7976931348623157e+308;
  };
  if (v.isDouble()) return bad(v.toDouble());
  if (wrapped_number(v) && c10::isFloatingType(v.toTensor().scalar_type())) return bad(wrapped_double(v.toTensor()));
  if (v.isDoubleList()) {
    for (double x : v.toDoubleList()) if (bad(x)) return true;
  }
  return false;
}

void flat(const c10::IValue& v, std::vector<c10::optional<at::Tensor>>& out) {
  if (v.isTensor()) {
    if (v.toTensor().defined() && !wrapped_number(v)) out.emplace_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) if (t.defined()) out.emplace_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) flat(e, out);
  }
}

// bind the iteration's rows (Python: what the capture has for the iteration in progress)
bool bound() {
  if (!g->rows.is_none() && g->rows) return true;
  py::object got = g->bind_cb();
  if (got.is_none()) return false;
  auto t = got.cast<py::tuple>();
  g->rows = t[0];
  g->ts = t[1].cast<int64_t>();
  return true;
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(sizes[i]);
  }
  return s + ')';
}

// the name of operator `index` (GIL held): made once per (index, scope, overload)
NameSlot& name_slot(int scope, const Overload* ov, int64_t index) {
  auto& cache = g->name_cache;
  if (static_cast<size_t>(index) >= cache.size()) cache.resize(static_cast<size_t>(index) + 1);
  NameSlot& s = cache[static_cast<size_t>(index)];
  if (s.scope != scope || s.ov != ov || !s.pyname) {
    s.scope = scope;
    s.ov = ov;
    s.name = g->scopes[scope] + "/" + ov->op_type_s + "-op" + std::to_string(index);
    s.pyname = py::str(s.name);
    s.listed = false;
    s.shapes[0].clear();
    s.shapes[1].clear();
  }
  return s;
}

// the shape text and byte count of `t` as slot `k` of a side of `slot` (GIL held)
ShapeText& shape_of(NameSlot* slot, std::vector<ShapeText>& scratch, int side, size_t k, const at::Tensor& t) {
  std::vector<ShapeText>& shapes = slot != nullptr ? slot->shapes[side] : scratch;
  if (shapes.size() <= k) shapes.resize(k + 1);
  ShapeText& st = shapes[k];
  const c10::IntArrayRef sizes = t.sizes();
  const int64_t itemsize = static_cast<int64_t>(t.element_size());
  if (!st.shape || st.itemsize != itemsize || !sizes.equals(st.sizes)) {
    st.sizes.assign(sizes.begin(), sizes.end());
    st.itemsize = itemsize;
    st.shape = py::str(shape_text(sizes));
    st.nbytes = py::int_(t.numel() * itemsize);
  }
  return st;
}

int64_t next_ts(int64_t count) {
  int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  if (now <= g->ts) now = g->ts + 1;
  g->ts = now + count - 1;
  return now;
}

// the rows of one operator side (GIL held; `side` 0: inputs, 1: outputs)
void record(Ctx* c, int side, const py::object& io, const std::vector<c10::optional<at::Tensor>>& tensors) {
  if (tensors.empty()) return;
  bool native = true, dense = true;
  for (const auto& t : tensors) {
    if (!t) continue;
    if (!t->defined() || t->layout() != at::kStrided || !t->device().is_cpu() ||
        t->key_set().has(c10::DispatchKey::Python) || !opdump::StatsMemo::takes(*t)) {
      native = false;
      break;
    }
    dense = dense && t->is_non_overlapping_and_dense();
  }
  if (!native) {       // the Python recorder (it appends to the same batch; its torch calls are its own)
    at::RecordFunctionGuard off(false);
    py::list items;
    for (const auto& t : tensors) items.append(t ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*t)) : py::none());
    g->ts = g->slow_cb(c->ov->op_type, c->name, io, items, g->ts).cast<int64_t>();
    return;
  }
  // the memo runs a torch call (a contiguous copy) only for a tensor that is not dense: that call
  // is opdump's own (no callback sees it); otherwise no guard (each one rebuilds the thread's
  // callback lists, twice)
  c10::optional<at::RecordFunctionGuard> off;
  if (!dense) off.emplace(false);
  const int64_t ts = next_ts(static_cast<int64_t>(tensors.size()));
  PyObject* rows = g->rows.ptr();
  PyObject* entries = g->entries.ptr();
  NameSlot* slot = (c->index >= 0 && static_cast<size_t>(c->index) < g->name_cache.size())
                       ? &g->name_cache[static_cast<size_t>(c->index)] : nullptr;
  std::vector<ShapeText> scratch;
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k]) continue;
    const at::Tensor& t = *tensors[k];
    PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));   // borrowed
    const int64_t index = static_cast<int64_t>(PyList_GET_SIZE(entries));
    py::object handle = g->memo->stats(t, index);
    if (handle.is_none()) throw std::logic_error("the memo declined a tensor it takes");
    if (!PyLong_Check(handle.ptr())) {
      if (PyList_Append(entries, handle.ptr()) != 0 || PyList_Append(g->dtypes.ptr(), dtype) != 0)
        throw py::error_already_set();
      handle = py::int_(index);
    }
    ShapeText& st = shape_of(slot, scratch, side, k, t);
    py::object stamp = py::int_(ts + static_cast<int64_t>(k));
    py::object at_slot = py::int_(static_cast<int64_t>(k));
    PyObject* row = PyTuple_New(static_cast<Py_ssize_t>(kRowFields));
    if (row == nullptr) throw py::error_already_set();
    auto put = [row](int field, PyObject* value) {     // a new reference to a borrowed value
      Py_INCREF(value);
      PyTuple_SET_ITEM(row, static_cast<Py_ssize_t>(field), value);
    };
    put(kRowOpType, c->ov->op_type.ptr());
    put(kRowOpName, c->name.ptr());
    put(kRowStream, g_zero.ptr());
    put(kRowTimestamp, stamp.ptr());
    put(kRowIo, io.ptr());
    put(kRowSlot, at_slot.ptr());
    put(kRowNbytes, st.nbytes.ptr());
    put(kRowDtype, dtype);
    put(kRowShape, st.shape.ptr());
    put(kRowHandle, handle.ptr());
    put(kRowHostFuture, Py_None);
    // a row holds strings, ints, a dtype and a tuple of numbers: it can be in no reference
    // cycle, so the garbage collector need not track it (thousands a step, each kept until the
    // writer takes it: tracked, they were promoted to the oldest generation and brought on
    // full collections)
    PyObject_GC_UnTrack(row);
    const int appended = PyList_Append(rows, row);
    Py_DECREF(row);
    if (appended != 0) throw py::error_already_set();
    ++g->recorded;
  }
}

// scope id of a backward operator running `node`; -1: not captured (a compiled region)
int backward_scope(torch::autograd::Node* node, int64_t* forward_index) {
  *forward_index = -1;
  // AccumulateGrad's sequence number is UINT64_MAX: no forward operator's (as in dispatch.py,
  // whose Python ints never wrap to the -1 a forward call may have stored)
  const uint64_t nr = node->sequence_nr();
  auto it = nr > static_cast<uint64_t>(INT64_MAX) ? g->seq.end() : g->seq.find(static_cast<int64_t>(nr));
  if (it != g->seq.end()) {
    *forward_index = it->second.second;
    const int fwd = it->second.first;
    if (g->gradient_of.size() <= static_cast<size_t>(fwd)) g->gradient_of.resize(fwd + 1, -1);
    if (g->gradient_of[fwd] < 0) {
      const int id = intern("Gradients/" + g->scopes[fwd]);
      g->gradient_of.resize(std::max(g->gradient_of.size(), g->scopes.size()), -1);
      g->gradient_of[fwd] = id;
    }
    return g->gradient_of[fwd];
  }
  if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
    const at::Tensor& var = acc->variable;
    if (var.defined()) {
      auto o = g->owners.find(var.unsafeGetTensorImpl());
      if (o != g->owners.end()) return o->second;
      py::gil_scoped_acquire gil;
      py::object got = g->owner_cb(py::reinterpret_steal<py::object>(THPVariable_Wrap(var)));
      int id = got.is_none() ? g->gradients : intern(got.cast<std::string>());
      g->owners.emplace(var.unsafeGetTensorImpl(), id);
      return id;
    }
  }
  return g->gradients;
}

// served iterations (path.py's inert mode on the stack): the Python dispatch keys stay off the
// thread's included set, so that operators do not reach the mode; a mode handling a detach (an
// autograd node saving/unpacking an output) pushes it back on the stack afterwards, which turns
// them on again: off again at the next callback (the operator whose keys were computed before
// reaches the inert mode, which forwards it)
inline void python_keys_off() {
  if (g->inert) {
    const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
    if (included.has(c10::DispatchKey::Python) || included.has(c10::DispatchKey::PythonTLSSnapshot)) {
      c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Python, false);
      c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::PythonTLSSnapshot, false);
    }
  }
}


// an operator's outputs as the Python capture lists them (dispatch.py: the written arguments of
// an operator returning nothing, else each returned slot)
std::vector<c10::optional<at::Tensor>> outputs_of(const at::RecordFunction& fn, const Ctx* c) {
  std::vector<c10::optional<at::Tensor>> outs;
  if (c->ov->mutated) {
    for (const at::Tensor& t : c->written) outs.emplace_back(t);
    return outs;
  }
  const auto& outputs = fn.outputs();
  bool plain = true;
  for (const c10::IValue& v : outputs) plain = plain && (v.isTensor() || v.isNone());
  if (outputs.size() == 1 && outputs[0].isTensorList()) {
    for (const at::Tensor& t : outputs[0].toTensorList()) outs.emplace_back(t);
  } else if (plain) {
    for (const c10::IValue& v : outputs) {
      if (v.isTensor() && v.toTensor().defined()) outs.emplace_back(v.toTensor());
      else outs.emplace_back(c10::nullopt);
    }
  } else {
    for (const c10::IValue& v : outputs) flat(v, outs);
  }
  return outs;
}

// op_debug_mode 3 (watch.h), at a captured operator's start (GIL held): keep its inputs, copy
// what it writes unless Python's rule says it cannot be an origin
void watch_start(const at::RecordFunction& fn, Ctx* c, c10::ArrayRef<c10::IValue> inputs) {
  opdump::watch::InFlight& w = c->watch;
  if (opdump::watch::always_python(c->ov->op_type_s)) {
    w.to_python = true;
  } else {
    w.kind = opdump::watch::decide(c->ov, fn.name(), fn.overload_name(), inputs,
                                   [&] { return python_args(fn, inputs); });
    if (w.kind & opdump::watch::kPreserving) w.inputs_known = opdump::watch::inputs_finite(inputs);
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

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (g == nullptr) return nullptr;
  python_keys_off();
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
    // reaches a dispatch mode: not an operator the Python capture sees
    if (tls_excluded.has(c10::DispatchKey::Python)) {
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
    py::gil_scoped_acquire gil;
    if (!bound()) {
      return;
    }
    ctx->captured = true;
    ctx->phase = static_cast<int>(phase);
    ctx->scope = scope;
    ctx->index = g->index++;
    NameSlot& slot = name_slot(scope, ov, ctx->index);
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
    g->names.append(slot.pyname);
    g->all_names.push_back(slot.pyname);
    if (!g->watch) ctx->name = slot.pyname;    // the watch takes it from name_cache when it needs it
    if (!listed && !g->probe) {
      py::list args = python_args(fn, inputs);
      py::object var = py::none();
      if (node) {
        if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
          if (acc->variable.defined()) var = py::reinterpret_steal<py::object>(THPVariable_Wrap(acc->variable));
        }
      }
      ctx->describe = g->describe_start_cb(ctx->index, ov->op_type, py::str(fn.overload_name()),
                                           py::str(g->scopes[scope]), static_cast<int>(phase),
                                           forward_index >= 0 ? g->all_names[forward_index]
                                                              : py::object(py::none()),
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
  return ctx;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (g == nullptr) return;
  python_keys_off();
  if (raw == nullptr) return;
  Ctx* c = static_cast<Ctx*>(raw);
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
  t_candidates.clear();       // nothing is in flight at a boundary
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
