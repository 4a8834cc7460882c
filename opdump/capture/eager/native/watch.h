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
// What Python's rules (opdump/debug/overflow_rules.py) say of an operator is asked once per
// overload and per set of number arguments (they depend on nothing else) and kept as bits:
// * kCopy: an in-place operator's written tensors are copied before it runs (the values an
//   origin's recorded inputs must have): needs_prewrite_copy.  Copies go to a small pool
//   (reused when the operator's outputs were finite: nobody else saw them);
// * kPreserving: FINITE_PRESERVING (views, relu, cat…) or a scale by at most 1: its outputs
//   are not read when every floating input is known finite;
// * kAlways: ALWAYS_FINITE (zeros, bernoulli_…): its outputs are never read.
// Known finite: a tensor read finite whose elements cover its whole storage marks that storage
// finite at its version counter's value (a weak reference keeps the address from being
// reused); a view of it at the same version is known finite without a reading.  Forgotten at
// each iteration's start.
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
  int kind = 0;                          // kCopy | kPreserving | kAlways (decide)
  bool inputs_known = false;             // every floating input known finite at its start
  bool written_at_start = false;         // prove() asked before an in-place write
  bool proven = false;                   // its outputs proven finite (facts b, l): not read
  double b = 0.0, l = 0.0;
};

constexpr int kCopy = 1, kPreserving = 2, kAlways = 4, kBounded = 8, kPython = 16;
// prove() asks Python only for this many elements: an in-place operator's written tensors (the
// copy and the reading it saves), other operators' outputs (the reading it saves)
constexpr int64_t kProveWritten = 8192, kProveOutputs = int64_t(1) << 17;

// the Python call-backs: kind_cb(qualname, overload, values) -> the kind bits;
// bound_cb(qualname, overload, values, outputs) -> facts (B, L) proving the outputs finite, or None;
// add_cb(index, name, qualname, overload, values, saved inputs, outputs, copies)
void configure(pybind11::object kind_cb, pybind11::object bound_cb, pybind11::object add_cb, const std::vector<std::string>& to_python);
void clear();
// the kind bits of an operator call, kPython for an operator type always handed to Python (its
// outputs are uninitialized memory); on a cache miss the GIL is taken and `values` builds the
// arguments as a dispatch mode receives them
int decide(const void* overload, const std::string& op_type, const char* qualname, const char* overload_name,
           c10::ArrayRef<c10::IValue> inputs, const std::function<pybind11::list()>& values);
// every floating tensor among `inputs` known finite (see above)
bool inputs_finite(c10::ArrayRef<c10::IValue> inputs);
// the outputs are finite without a reading (kAlways, kPreserving of known inputs, proven):
// remembered, with their facts when known (NaN: not known)
void known_outputs(const std::vector<c10::optional<at::Tensor>>& outs, double b, double l);
// the facts of a tensor known finite, (B, L), or None (opdump.debug.overflow_bounds asks)
pybind11::object facts(const at::Tensor& t);
// kBounded: do the magnitude rules prove `outs` finite from the inputs' known facts?  (asked only
// for enough elements and when every floating input's facts are known; the GIL is taken to ask)
bool prove(InFlight& op, const char* qualname, const char* overload_name, c10::ArrayRef<c10::IValue> inputs,
           const std::vector<c10::optional<at::Tensor>>& outs, const std::function<pybind11::list()>& values);
// a new iteration: what was known is forgotten
void new_iteration();
// at the operator's start: keep its inputs, copy what it writes (when `copy`)
void start(InFlight& op, c10::ArrayRef<c10::IValue> inputs, const std::vector<at::Tensor>& written, bool copy);
// every floating output finite, known or read here (false: Python judges the operator)
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
