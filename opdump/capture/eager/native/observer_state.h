// The native eager observer's shared state (observer.cpp's callbacks, observer_api.cpp's calls
// from Python): what an operator overload is, a captured call in flight, the per-operator-index
// name and shape caches, the process's State, and what each of the observer's files gives the
// others.
//
// Why one header: the observer is split by job (observer.cpp: the callbacks; observer_names.cpp:
// scopes and names; observer_args.cpp: values as Python sees them; observer_rows.cpp: the rows;
// observer_api.cpp: what Python calls), and they all read and write the one State `g`.
// Guarantees: everything here lives in opdump::eager_observer and is used by these files only
// (Python reaches the observer only through register_eager_observer's submodule); State is
// touched only by the callbacks and by the calls Python makes at boundaries.
//
// libtorch is built with NDEBUG, and at::RecordFunction has a member only without it: this file
// must see the class as libtorch does (its other members' offsets), whatever the build's flags.
#pragma once

#ifndef NDEBUG
#define NDEBUG 1
#endif
#include <torch/extension.h>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../../../stats/row_batch.h"
#include "../../../stats/stats_memo.h"
#include "watch.h"

namespace opdump {
namespace eager_observer {

namespace py = pybind11;

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
  bool python_off = false;       // served: the Python key excluded while it runs (observer.cpp, exclude_python)
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
using ShapeText = opdump::ShapeText;   // the row's shape text and byte count (stats/row_batch.h)

struct NameSlot {
  int scope = -1;
  const Overload* ov = nullptr;
  std::string name;
  py::object pyname;
  bool listed = false;           // known listed (the listed set only grows until configure() clears both)
  std::vector<ShapeText> shapes[2];   // per side (input, output), per slot
};

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
  // the iteration before's seq (new_iteration): a backward node of its forward may run in this one (a
  // GAN's generator, whose forward precedes the discriminator's optimizer step); forward index
  // -2 - k names before_names[k], its forward operator's name (None: none)
  std::unordered_map<int64_t, std::pair<int, int64_t>> before;
  std::vector<py::object> before_names;
  std::vector<int> gradient_of;  // scope id -> id of "Gradients/<scope>" (-1: not yet)
  std::unordered_map<const c10::TensorImpl*, int> owners;   // parameter -> scope (this iteration)
  std::unordered_set<std::string> listed;
  int64_t index = 0;
  int64_t names_from = 0;        // the first operator index whose name pause() has not handed over
  std::vector<NameSlot> name_cache;   // per operator index (see NameSlot)
  std::vector<std::string> nonfinite;                          // listed operators seen with an Inf/NaN scalar
  std::unordered_map<std::pair<const void*, const void*>, std::unique_ptr<Overload>, PairHash> overloads;
  int gradients = -1;            // scope id of "Gradients/Default"
};

// defined in observer_api.cpp (configure() makes them; they live for the process)
extern State* g;
extern py::object g_io_input, g_io_output, g_zero;

// ---- observer.cpp (the callbacks)
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
void on_end(const at::RecordFunction& fn, at::ObserverContext* raw);
// the calling thread's candidates in flight are forgotten (install(): nothing is in flight at a boundary)
void clear_in_flight();

// ---- observer_names.cpp (scopes, overloads, operator names)
int intern(const std::string& s);
Overload* overload_of(const at::RecordFunction& fn);
int backward_scope(torch::autograd::Node* node, int64_t* forward_index);
// the name of the forward operator backward_scope gave (None: none)
py::object forward_name(int64_t forward_index);
NameSlot& name_slot(int scope, const Overload* ov, int64_t index);

// ---- observer_args.cpp (arguments and outputs as the Python capture sees them)
py::list python_args(const at::RecordFunction& fn, c10::ArrayRef<c10::IValue> inputs);
bool nonfinite_scalar(const c10::IValue& v);
void flat(const c10::IValue& v, std::vector<c10::optional<at::Tensor>>& out);
std::vector<c10::optional<at::Tensor>> outputs_of(const at::RecordFunction& fn, const Ctx* c);

// ---- observer_rows.cpp (statistic.csv rows)
bool bound();
void record(Ctx* c, int side, const py::object& io, const std::vector<c10::optional<at::Tensor>>& tensors);

}  // namespace eager_observer
}  // namespace opdump
