// The native eager observer's statistic.csv rows: one row per tensor of an operator side, its
// statistics from the native memo (opdump/stats/stats_memo.cpp) or, for a tensor the memo does
// not take, from the Python recorder (slow_cb), appended to the list the capture binds for the
// iteration (bound).
// Guarantees: a row is the tuple opdump/stats/contract.h lays out (a record of the RowBatch the
// capture binds, opdump/stats/row_batch.h, when it binds one), with timestamps increasing
// (next_ts); shape texts and byte counts are made once per operator index and shape; called
// with the GIL held; errors are thrown to the callbacks' guard (observer.cpp).
#include "observer_state.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>

#include "../../../stats/contract.h"

namespace opdump {
namespace eager_observer {

using namespace opdump::contract;

namespace {

int64_t next_ts(int64_t count) {
  int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  if (now <= g->ts) now = g->ts + 1;
  g->ts = now + count - 1;
  return now;
}

}  // namespace

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

// the rows of one operator side (GIL held; `side` 0: inputs, 1: outputs)
void record(Ctx* c, int side, const py::object& io, const std::vector<c10::optional<at::Tensor>>& tensors) {
  if (tensors.empty()) return;
  bool native = true;
  for (const auto& t : tensors) {
    if (!t) continue;
    if (!t->defined() || t->layout() != at::kStrided || !t->device().is_cpu() ||
        t->key_set().has(c10::DispatchKey::Python) || !opdump::StatsMemo::takes(*t)) {
      native = false;
      break;
    }
  }
  if (!native) {       // the Python recorder (it appends to the same batch; its torch calls are its own)
    at::RecordFunctionGuard off(false);
    py::list items;
    for (const auto& t : tensors) items.append(t ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*t)) : py::none());
    g->ts = g->slow_cb(c->ov->op_type, c->name, io, items, g->ts).cast<int64_t>();
    return;
  }
  // the memo makes no torch call (a tensor with gaps is gathered by hand, stats_memo.cpp): no
  // RecordFunctionGuard (each one rebuilds the thread's callback lists, twice)
  const int64_t ts = next_ts(static_cast<int64_t>(tensors.size()));
  PyObject* rows = g->rows.ptr();
  PyObject* entries = g->entries.ptr();
  NameSlot* slot = (c->index >= 0 && static_cast<size_t>(c->index) < g->name_cache.size())
                       ? &g->name_cache[static_cast<size_t>(c->index)] : nullptr;
  std::vector<ShapeText> scratch;
  std::vector<ShapeText>& shapes = slot != nullptr ? slot->shapes[side] : scratch;
  opdump::RowBatch* batch = opdump::row_batch_of(rows);    // records (row_batch.h), or a list of tuples
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
    const ShapeText& st = opdump::shape_of(shapes, k, t);
    if (batch != nullptr) {
      const long long h = PyLong_AsLongLong(handle.ptr());
      if (h == -1 && PyErr_Occurred()) throw py::error_already_set();
      batch->add(c->ov->op_type.ptr(), c->name.ptr(), io.ptr(), ts + static_cast<int64_t>(k), static_cast<int64_t>(k),
                 st, dtype, h);
      ++g->recorded;
      continue;
    }
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

}  // namespace eager_observer
}  // namespace opdump
