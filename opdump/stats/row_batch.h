// Queued statistic.csv rows as C++ records (RowBatch), and the shape text both native row makers
// share (the native eager observer, observer_rows.cpp; the graph taps, row_sink.cpp).
//
// Why: a row kept as a Python tuple costs its making on the training thread (a tuple, an int per
// timestamp and slot, an append: ~0.4 us a row, ~1,300 rows a step of a small decoder) and its
// unpacking in the writer thread (cell_text.cpp encode_rows). A record is seven reference-count
// increments and three integers in a vector; its text is made from it directly.
//
// Guarantees (tests/test_row_batch.py):
// * a RowBatch is a sequence of the rows opdump/stats/contract.h lays out: `batch[i]` (and
//   iteration) gives the very tuple a list of rows would hold (made when asked, untracked by the
//   garbage collector like the rows it stands for); rows appended from Python (`append`,
//   `extend`, `+=`) are kept as the tuples they are, in order with the native records;
// * encode_rows (cell_text.cpp) writes a RowBatch's rows as the bytes it writes for the list of
//   the same tuples;
// * a record holds strong references to its objects (released with the batch, GIL held).
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "contract.h"

namespace opdump {

// formatting.format_shape: "(2,3)", "(5)", "()"
inline std::string shape_text(c10::IntArrayRef sizes) {
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(sizes[i]);
  }
  s += ')';
  return s;
}

// A slot's shape text (a str) and byte count, made again only when its sizes or element size
// change: the same objects row after row, step after step.
struct ShapeText {
  std::vector<int64_t> sizes;
  int64_t itemsize = -1;
  int64_t bytes = 0;
  pybind11::object shape, nbytes;      // the row's shape text and byte count (Python str, int)
};

// the shape text of `t` as slot `k` of `slots` (GIL held)
inline ShapeText& shape_of(std::vector<ShapeText>& slots, size_t k, const at::Tensor& t) {
  if (slots.size() <= k) slots.resize(k + 1);
  ShapeText& st = slots[k];
  const c10::IntArrayRef sizes = t.sizes();
  const int64_t itemsize = static_cast<int64_t>(t.element_size());
  if (!st.shape || st.itemsize != itemsize || !sizes.equals(st.sizes)) {
    pybind11::object shape = pybind11::str(shape_text(sizes));
    st.bytes = t.numel() * itemsize;
    pybind11::object nbytes = pybind11::reinterpret_steal<pybind11::object>(PyLong_FromLongLong(st.bytes));
    if (!nbytes) throw pybind11::error_already_set();
    st.sizes.assign(sizes.begin(), sizes.end());
    st.itemsize = itemsize;
    st.shape = std::move(shape);
    st.nbytes = std::move(nbytes);
  }
  return st;
}

// One row: a native record (stream 0, no host future) or, `tuple` set, a row appended from Python.
struct RowRecord {
  PyObject* op_type = nullptr;   // strong references (nullptr in a Python row)
  PyObject* name = nullptr;
  PyObject* io = nullptr;
  PyObject* dtype = nullptr;
  PyObject* shape = nullptr;
  PyObject* nbytes = nullptr;    // the int object (the lazy tuple's field)
  PyObject* tuple = nullptr;     // a Python row, kept as it is
  int64_t ts = 0;
  int64_t bytes = 0;
  int64_t handle = -1;           // the statistics handle (>= 0)
  int64_t slot = 0;
};

class RowBatch {
 public:
  RowBatch() = default;
  RowBatch(const RowBatch&) = delete;
  RowBatch& operator=(const RowBatch&) = delete;
  ~RowBatch() { clear(); }        // pybind11 deallocates with the GIL held

  size_t size() const { return rows_.size(); }
  const RowRecord& at(size_t i) const { return rows_[i]; }
  size_t records() const {
    size_t n = 0;
    for (const RowRecord& r : rows_) n += r.tuple == nullptr;
    return n;
  }

  // a native record; every object borrowed (a reference is taken)
  void add(PyObject* op_type, PyObject* name, PyObject* io, int64_t ts, int64_t slot, const ShapeText& shape,
           PyObject* dtype, int64_t handle) {
    RowRecord r;
    r.op_type = op_type;
    r.name = name;
    r.io = io;
    r.dtype = dtype;
    r.shape = shape.shape.ptr();
    r.nbytes = shape.nbytes.ptr();
    Py_INCREF(op_type);
    Py_INCREF(name);
    Py_INCREF(io);
    Py_INCREF(dtype);
    Py_INCREF(r.shape);
    Py_INCREF(r.nbytes);
    r.ts = ts;
    r.bytes = shape.bytes;
    r.handle = handle;
    r.slot = slot;
    rows_.push_back(r);
  }

  // a row from Python (borrowed; a reference is taken)
  void add_tuple(PyObject* row) {
    RowRecord r;
    Py_INCREF(row);
    r.tuple = row;
    rows_.push_back(r);
  }

  // row `i` as the tuple contract.h lays out (a new reference)
  pybind11::object row(size_t i) const {
    const RowRecord& r = rows_[i];
    if (r.tuple != nullptr) return pybind11::reinterpret_borrow<pybind11::object>(r.tuple);
    using namespace opdump::contract;
    PyObject* t = PyTuple_New(kRowFields);
    if (t == nullptr) throw pybind11::error_already_set();
    pybind11::object keep = pybind11::reinterpret_steal<pybind11::object>(t);
    auto borrowed = [t](int field, PyObject* v) {
      Py_INCREF(v);
      PyTuple_SET_ITEM(t, field, v);
    };
    auto owned = [t](int field, PyObject* v) {
      if (v == nullptr) throw pybind11::error_already_set();
      PyTuple_SET_ITEM(t, field, v);
    };
    borrowed(kRowOpType, r.op_type);
    borrowed(kRowOpName, r.name);
    owned(kRowStream, PyLong_FromLong(0));
    owned(kRowTimestamp, PyLong_FromLongLong(r.ts));
    borrowed(kRowIo, r.io);
    owned(kRowSlot, PyLong_FromLongLong(r.slot));
    borrowed(kRowNbytes, r.nbytes);
    borrowed(kRowDtype, r.dtype);
    borrowed(kRowShape, r.shape);
    owned(kRowHandle, PyLong_FromLongLong(r.handle));
    borrowed(kRowHostFuture, Py_None);
    PyObject_GC_UnTrack(t);        // strs, ints, a dtype, None: no cycle
    return keep;
  }

  void clear() {
    std::vector<RowRecord> rows;
    rows.swap(rows_);
    for (RowRecord& r : rows) {
      Py_XDECREF(r.op_type);
      Py_XDECREF(r.name);
      Py_XDECREF(r.io);
      Py_XDECREF(r.dtype);
      Py_XDECREF(r.shape);
      Py_XDECREF(r.nbytes);
      Py_XDECREF(r.tuple);
    }
  }

 private:
  std::vector<RowRecord> rows_;
};

// `obj`'s RowBatch when it is one (a type comparison, then the instance's value), else nullptr
// (defined in row_sink.cpp, which registers the class).
RowBatch* row_batch_of(PyObject* obj);

}  // namespace opdump
