// The native eager observer's scopes and names: scope ids (intern), what an operator overload is
// (overload_of: its dispatch table and one call into Python, once per overload), the scope of a
// backward operator (backward_scope: its forward operator's, under "Gradients/", as
// opdump/capture/eager/dispatch.py names it) and the name of operator index i (name_slot, made
// once per index while its scope and overload stay the same).
// Guarantees: names and scopes follow dispatch.py's rules (see each function); errors are
// thrown to the callbacks' guard (observer.cpp), which turns the observer off.
#include "observer_state.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>

namespace opdump {
namespace eager_observer {

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

py::object forward_name(int64_t forward_index) {
  if (forward_index >= 0) return g->name_cache[static_cast<size_t>(forward_index)].pyname;
  const int64_t k = -2 - forward_index;
  if (k >= 0 && static_cast<size_t>(k) < g->before_names.size()) return g->before_names[static_cast<size_t>(k)];
  return py::none();
}

// scope id of a backward operator running `node`; -1: not captured (a compiled region)
int backward_scope(torch::autograd::Node* node, int64_t* forward_index) {
  *forward_index = -1;
  // AccumulateGrad's sequence number is UINT64_MAX: no forward operator's (as in dispatch.py,
  // whose Python ints never wrap to the -1 a forward call may have stored)
  const uint64_t nr = node->sequence_nr();
  auto it = nr > static_cast<uint64_t>(INT64_MAX) ? g->seq.end() : g->seq.find(static_cast<int64_t>(nr));
  if (it == g->seq.end() && nr <= static_cast<uint64_t>(INT64_MAX)) {   // a forward of the iteration before
    auto b = g->before.find(static_cast<int64_t>(nr));
    if (b != g->before.end()) it = b;
  }
  if (it != g->seq.end() && it != g->before.end()) {
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

}  // namespace eager_observer
}  // namespace opdump
