// The native eager observer's overflow watch (op_debug_mode 3; README "Debug dumps"): the
// per-operator part of opdump/debug/overflow.py's watch that needs no Python.
//
// Why: an every-step watch visits every operator, and almost every operator's outputs are
// finite: for those the verdict of opdump.debug.origin.judge is "none", whatever the inputs.
// So per operator the observer only reads its floating outputs' finiteness (finite_read, the
// integer pass of opdump/stats/finite_bound.cpp); an operator with a non-finite output (or
// one whose tensors this reading does not handle, or one whose outputs are uninitialized
// memory) is handed to Python -- OverflowWatch.add, with its inputs as they were before it
// ran -- where the one rule decides and the watch records it as it does for the Python
// capture.  No copy of the rule lives here.
//
// In-place operators: the values an origin's recorded inputs must have are those before the
// write, so the written tensors are copied before the operator runs unless Python's
// needs_prewrite_copy (opdump/debug/overflow_rules.py) says it cannot be an origin; that
// decision is asked once per overload and per set of number arguments (it depends on
// nothing else) and kept.  Copies go to a small pool (reused when the operator's outputs were
// finite: nobody else saw them).
#pragma once

#include <torch/extension.h>

#include <functional>
#include <string>
#include <vector>

namespace opdump {
namespace watch {

// one watched operator between its start and its end
struct InFlight {
  std::vector<c10::IValue> inputs;       // its arguments, kept alive (not copied) until its outputs are read
  std::vector<at::Tensor> originals;     // the tensors it writes that were copied before it ran...
  std::vector<at::Tensor> copies;        // ...and those copies (private)
  bool to_python = false;                // handed to Python whatever its outputs
};

// the Python call-backs: copy_cb(qualname, overload, values) -> bool (needs a pre-write copy);
// add_cb(index, name, qualname, overload, values, saved inputs, outputs, copies)
void configure(pybind11::object copy_cb, pybind11::object add_cb, const std::vector<std::string>& to_python);
void clear();
// an operator type always handed to Python (its outputs are uninitialized memory)
bool always_python(const std::string& op_type);
// must the tensors an in-place operator writes be copied before it runs?  (GIL not needed;
// `values` builds the arguments as a dispatch mode receives them, on a cache miss)
bool needs_copy(const void* overload, const char* qualname, const char* overload_name,
                c10::ArrayRef<c10::IValue> inputs, const std::function<pybind11::list()>& values);
// at the operator's start: keep its inputs, copy what it writes (when `copy`)
void start(InFlight& op, c10::ArrayRef<c10::IValue> inputs, const std::vector<at::Tensor>& written, bool copy);
// every floating output finite and read here (false: Python judges the operator)
bool finite(const std::vector<c10::optional<at::Tensor>>& outs);
// the operator had finite outputs: its copies go back to the pool
void recycle(InFlight& op);
// hand the operator to Python (GIL held): `flat_in` its inputs flattened as the Python capture
// flattens them; the copies replace the tensors they were taken of
void hand_over(InFlight& op, int64_t index, const pybind11::object& name, const char* qualname,
               const char* overload_name, const pybind11::list& values,
               const std::vector<c10::optional<at::Tensor>>& flat_in,
               const std::vector<c10::optional<at::Tensor>>& outs);
// operators read / handed over / copies made since the last call (counters for path.py and tests)
std::vector<int64_t> take_counts();

}  // namespace watch
}  // namespace opdump
