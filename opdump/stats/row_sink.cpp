// The recorder's device-statistics fast path for CPU tensors, in C++.
//
// Why: with statistics on the device only, recording an operator's tensors is a
// statistic.csv row per tensor plus a statistics lookup — ~1 us of Python per tensor
// and ~3 us per operator side around it (attribute reads, a tuple of eleven fields, the
// batch's bookkeeping), more than the memo's own work once a tensor has been read.
//
// Guarantees of `RowSink.record(base, op_type, name, io, ts, tensors)` (tested in
// tests/test_row_sink.py against Recorder.record_all's Python loop):
// * it returns `(rows, entries, dtypes)`, three new lists, and edits no object of the
//   caller's: `rows` holds exactly the tuples that loop builds — per tensor at slot k
//   (None slots skipped) the fields of contract.h's RowField: (op_type, name, 0, ts + k,
//   io, k, nbytes, dtype, shape text, statistics handle, None);
// * the handle is the memo's entry for memory already read, or `base + j` for the j-th
//   tensor read now, whose fused tuple is `entries[j]` and dtype `dtypes[j]`: the caller
//   (DeviceStatsBatch) appends both to its entries, which then number `base`, `base + 1`…;
// * it takes the call only when every element is None or a CPU strided tensor of type
//   torch.Tensor or torch.nn.Parameter that the memo reads (StatsMemo::takes); otherwise
//   it returns None having changed nothing, and the Python loop (which knows the other
//   cases) records them.
#include "contract.h"
#include "graph_values.h"
#include "row_batch.h"
#include "stats_memo.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <stdexcept>
#include <utility>
#include <vector>
#include <string>

namespace {

namespace py = pybind11;
using namespace opdump::contract;

using opdump::RowBatch;
using opdump::ShapeText;
using opdump::shape_text;

class RowSink {
 public:
  RowSink(py::object memo, py::object parameter_type)
      : memo_obj_(std::move(memo)), memo_(memo_obj_.cast<opdump::StatsMemo*>()),
        parameter_type_(std::move(parameter_type)) {}

  py::object record(int64_t base, py::object op_type, py::object name, py::object io, int64_t ts,
                    py::object tensors) {
    // a list or tuple is used as it is (PySequence_Fast returns it with a new reference)
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(tensors.ptr(), "tensors must be a sequence"));
    if (!seq) throw py::error_already_set();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    if (!takes_all(seq, n)) return py::none();     // first: is every element one this path takes?
    return rows_of(seq, n, base, op_type, name, io, ts);
  }

  // record()'s rows appended to `batch` (a RowBatch) as records; `names` a str (the operator's
  // name: row k at slot k) or a sequence of one name per tensor (parameters: row k named
  // names[k], at slot 0).  (count, entries, dtypes), or None having changed nothing.
  py::object record_into(py::object batch_obj, int64_t base, py::object op_type, py::object names, py::object io,
                         int64_t ts, py::object tensors) {
    RowBatch* batch = opdump::row_batch_of(batch_obj.ptr());
    if (batch == nullptr) throw py::type_error("RowSink.record_into: a RowBatch");
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(tensors.ptr(), "tensors must be a sequence"));
    if (!seq) throw py::error_already_set();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    py::object name_seq;
    if (!PyUnicode_Check(names.ptr())) {
      name_seq = py::reinterpret_steal<py::object>(PySequence_Fast(names.ptr(), "names must be a str or a sequence"));
      if (!name_seq) throw py::error_already_set();
      if (PySequence_Fast_GET_SIZE(name_seq.ptr()) != n) throw py::value_error("RowSink.record_into: one name per tensor");
    }
    if (!takes_all(seq, n)) return py::none();
    py::list entries, dtypes;
    std::vector<ShapeText> shape(1);
    int64_t count = 0;
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      const at::Tensor& t = THPVariable_Unpack(item);
      PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));   // borrowed
      const int64_t h = handle_of(t, base, entries, dtypes, dtype);
      PyObject* name = name_seq ? PySequence_Fast_GET_ITEM(name_seq.ptr(), k) : names.ptr();
      batch->add(op_type.ptr(), name, io.ptr(), ts + k, name_seq ? 0 : k, opdump::shape_of(shape, 0, t), dtype, h);
      ++count;
    }
    return py::make_tuple(count, entries, dtypes);
  }

 private:
  // is every element one this path takes (None, or a CPU strided Tensor/Parameter the memo reads)?
  bool takes_all(const py::object& seq, Py_ssize_t n) const {
    PyObject* param = parameter_type_.ptr();
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      if (!THPVariable_CheckExact(item) && reinterpret_cast<PyObject*>(Py_TYPE(item)) != param) return false;
      const at::Tensor& t = THPVariable_Unpack(item);
      if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() || !opdump::StatsMemo::takes(t)) {
        return false;
      }
    }
    return true;
  }

  // the statistics handle of `t`: the memo's entry for memory already read, or base + j for the
  // j-th tensor read now (its fused tuple appended to `entries`, its dtype to `dtypes`)
  int64_t handle_of(const at::Tensor& t, int64_t base, py::list& entries, py::list& dtypes, PyObject* dtype) {
    const int64_t index = base + static_cast<int64_t>(PyList_GET_SIZE(entries.ptr()));
    py::object handle = memo_->stats(t, index);
    if (handle.is_none()) throw std::logic_error("RowSink: the memo declined a tensor it takes");
    if (!PyLong_Check(handle.ptr())) {      // read now: a new entry of the batch
      if (PyList_Append(entries.ptr(), handle.ptr()) < 0 || PyList_Append(dtypes.ptr(), dtype) < 0) {
        throw py::error_already_set();
      }
      return index;
    }
    const long long h = PyLong_AsLongLong(handle.ptr());
    if (h == -1 && PyErr_Occurred()) throw py::error_already_set();
    return h;
  }

  py::object rows_of(const py::object& seq, Py_ssize_t n, int64_t base, const py::object& op_type,
                     const py::object& name, const py::object& io, int64_t ts) {
    py::list rows, entries, dtypes;
    py::int_ zero(0);
    py::none none;
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      const at::Tensor& t = THPVariable_Unpack(item);
      py::object dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())));
      py::object handle = py::int_(handle_of(t, base, entries, dtypes, dtype.ptr()));
      const int64_t slot = static_cast<int64_t>(k);
      py::tuple row(static_cast<size_t>(kRowFields));
      row[static_cast<size_t>(kRowOpType)] = op_type;
      row[static_cast<size_t>(kRowOpName)] = name;
      row[static_cast<size_t>(kRowStream)] = zero;
      row[static_cast<size_t>(kRowTimestamp)] = py::int_(ts + slot);
      row[static_cast<size_t>(kRowIo)] = io;
      row[static_cast<size_t>(kRowSlot)] = py::int_(slot);
      row[static_cast<size_t>(kRowNbytes)] = py::int_(t.numel() * t.element_size());
      row[static_cast<size_t>(kRowDtype)] = dtype;
      row[static_cast<size_t>(kRowShape)] = py::str(shape_text(t.sizes()));
      row[static_cast<size_t>(kRowHandle)] = handle;
      row[static_cast<size_t>(kRowHostFuture)] = none;
      rows.append(std::move(row));
    }
    return py::make_tuple(rows, entries, dtypes);
  }

  py::object memo_obj_;            // keeps memo_ alive
  opdump::StatsMemo* memo_;
  py::object parameter_type_;
};


// The taps of one dumped ATen graph (opdump/capture/graph/native_taps.py), called by the graph's
// generated code with no Python frame in between: an operator's statistic.csv rows and its
// tensors' statistics, made in one call.
//
// Why: the Python taps cost ~10 us per operator side around this very work (a bound method,
// the fault check, record_all's checks, the clock, the lock, the row sink's wrapper).
//
// Guarantees (tests/test_graph_native_taps.py, against the Python taps):
// * the rows are those Recorder.record_all's fast path appends, with the same handles: they go
//   to the recorder's `_pending[folder]` list under the recorder's `_lock`, each tensor read
//   now is appended to the batch's entry and dtype lists (its handle: its index there), and
//   the timestamps come from the recorder's Clock (its `_last`, under its lock): inputs at
//   ts, ts + 1…, then outputs; `both` records an operator's inputs then its outputs, taken
//   after it ran (used only for operators that write none of their arguments);
// * closed (no dumped call in progress, or released): a tap returns at once; opened in Python
//   mode, or for any call it does not take (an element that is not a CPU strided torch.Tensor
//   or Parameter the memo reads, an output that is not a tensor or a tuple/list of tensors and
//   Nones, a fault armed at stage "tap"), the runtime's Python taps record the call;
// * nothing is raised: an error calls the runtime's `_failed(exc, where)` (one warning, the
//   graph goes on) and closes the taps; even that call's errors are dropped;
// * `fast()` gives the same three taps as builtins taking their arguments without a tuple
//   (METH_FASTCALL, bound to this object): the graph's generated code calls them with no
//   pybind11 dispatch in between (~0.3 us a call less);
// * the rows and the statistics tuples are untracked by the garbage collector (they hold only
//   ints, strs, floats, a dtype and None: no cycle): ~1,300 rows a step of a small decoder
//   otherwise set off collections of the whole heap.
//
// The per-tap work uses the C API directly (interned attribute names, bound lock methods
// called without arguments): pybind11's attr("name") made a str per call.
class GraphTaps {
 public:
  GraphTaps(py::object memo, py::list entries, py::list dtypes, py::object parameter_type, py::list names,
            py::object armed, py::object runtime_ref)
      : memo_obj_(std::move(memo)), memo_(memo_obj_.cast<opdump::StatsMemo*>()), entries_(std::move(entries)),
        dtypes_(std::move(dtypes)), param_(std::move(parameter_type)), armed_(std::move(armed)),
        runtime_(std::move(runtime_ref)), tap_("tap"), input_("input"), output_("output"), zero_(0) {
    for (auto item : names) {        // (op_type, full name) per operator index
      py::tuple pair = item.cast<py::tuple>();
      op_types_.push_back(py::reinterpret_borrow<py::object>(pair[0]));
      op_names_.push_back(py::reinterpret_borrow<py::object>(pair[1]));
    }
    shapes_.resize(op_names_.size() * 2);
  }

  // A dumped call of iteration `iteration` starts: rows go to recorder._pending[folder]; `native`
  // false: every tap hands its call to the runtime's Python taps.  Native: the memo uses the
  // values carried from this iteration's earlier calls (StatsMemo::enter).
  void open(py::object recorder, py::object folder, bool native, int64_t iteration) {
    if (!memo_) return;             // released
    if (native) memo_->enter(iteration);
    iteration_ = iteration;
    recorder_ = recorder;
    folder_ = std::move(folder);
    py::object lock = recorder.attr("_lock");
    acquire_ = lock.attr("acquire");
    release_ = lock.attr("release");
    clock_ = recorder.attr("clock");
    py::object clock_lock = clock_.attr("_lock");
    clock_acquire_ = clock_lock.attr("acquire");
    clock_release_ = clock_lock.attr("release");
    state_ = native ? kNative : kPython;
  }

  // The three taps as METH_FASTCALL builtins bound to `owner` (this object's Python instance):
  // (inputs, outputs, both), or None when `owner` is not this object.
  static py::object fast(py::object owner) {
    static PyMethodDef defs[3] = {
        {"inputs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&GraphTaps::fast_inputs)),
         METH_FASTCALL, "tap(index, *tensors): an operator's inputs, before it runs"},
        {"outputs", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&GraphTaps::fast_outputs)),
         METH_FASTCALL, "tap(index, value): an operator's outputs, after it ran"},
        {"both", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&GraphTaps::fast_both)),
         METH_FASTCALL, "tap(index, value, *inputs): inputs then outputs, after it ran"}};
    GraphTaps* self = owner.cast<GraphTaps*>();
    if (self == nullptr || self_of(owner.ptr()) != self) return py::none();
    py::tuple out(3);
    for (size_t i = 0; i < 3; ++i) {
      PyObject* f = PyCFunction_New(&defs[i], owner.ptr());
      if (f == nullptr) throw py::error_already_set();
      out[i] = py::reinterpret_steal<py::object>(f);
    }
    return out;
  }

  // The call ends: taps return at once until the next open; gives the tensors recorded since open.
  // A call that ended natively (no failure) leaves the values of the tensors read so far to the
  // later calls of its iteration (StatsMemo::carry; the caller flushes the batch after this).
  int64_t close() {
    if (memo_ && entries_) {
      if (state_ == kNative) {
        memo_->carry(py::reinterpret_borrow<py::list>(entries_), iteration_);
      } else {
        memo_->leave();
      }
    }
    state_ = kClosed;
    recorder_ = folder_ = acquire_ = release_ = clock_ = clock_acquire_ = clock_release_ = py::object();
    const int64_t n = count_;
    count_ = 0;
    return n;
  }

  // For good (the session closed or the graph failed): every reference to Python objects dropped.
  void release() {
    state_ = kClosed;
    close();
    if (memo_) memo_->drop_carried();
    memo_ = nullptr;
    memo_obj_ = entries_ = dtypes_ = runtime_ = py::object();
  }

  void inputs(int64_t index, py::args tensors) {
    if (state_ == kClosed) return;
    tap(index, &PySequence_Fast_ITEMS(tensors.ptr())[0], PyTuple_GET_SIZE(tensors.ptr()), nullptr);
  }
  void outputs(int64_t index, py::object value) {
    if (state_ == kClosed) return;
    tap(index, nullptr, -1, value.ptr());
  }
  void both(int64_t index, py::object value, py::args tensors) {
    if (state_ == kClosed) return;
    tap(index, &PySequence_Fast_ITEMS(tensors.ptr())[0], PyTuple_GET_SIZE(tensors.ptr()), value.ptr());
  }

 private:
  enum State { kClosed, kNative, kPython };

  static GraphTaps* self_of(PyObject* owner) {
    auto* inst = reinterpret_cast<py::detail::instance*>(owner);
    return inst->get_value_and_holder(nullptr, false).value_ptr<GraphTaps>();
  }

  // args[0]: the operator index (an int; anything else: -1, the Python taps' business)
  static int64_t index_arg(PyObject* const* args, Py_ssize_t nargs) {
    if (nargs < 1 || !PyLong_CheckExact(args[0])) return -1;
    const long long v = PyLong_AsLongLong(args[0]);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
    return static_cast<int64_t>(v);
  }

  // the fastcall entry points: never raise (a tap records nothing rather than break the step)
  template <typename F>
  static PyObject* guarded(PyObject* owner, F&& body) {
    try {
      GraphTaps* self = self_of(owner);
      if (self != nullptr && self->state_ != kClosed) body(self);
    } catch (py::error_already_set& e) {
      e.restore();
      PyErr_Clear();
    } catch (...) {
    }
    if (PyErr_Occurred()) PyErr_Clear();
    Py_RETURN_NONE;
  }
  static PyObject* fast_inputs(PyObject* owner, PyObject* const* args, Py_ssize_t nargs) {
    return guarded(owner, [&](GraphTaps* self) {
      self->tap(index_arg(args, nargs), args + (nargs > 0 ? 1 : 0), nargs > 0 ? nargs - 1 : 0, nullptr);
    });
  }
  static PyObject* fast_outputs(PyObject* owner, PyObject* const* args, Py_ssize_t nargs) {
    return guarded(owner, [&](GraphTaps* self) {
      if (nargs >= 2) self->tap(index_arg(args, nargs), nullptr, -1, args[1]);
    });
  }
  static PyObject* fast_both(PyObject* owner, PyObject* const* args, Py_ssize_t nargs) {
    return guarded(owner, [&](GraphTaps* self) {
      if (nargs >= 2) self->tap(index_arg(args, nargs), args + 2, nargs - 2, args[1]);
    });
  }

  // a bound method called with no argument; its result dropped
  static void call0(const py::object& f) {
    PyObject* r = PyObject_CallNoArgs(f.ptr());
    if (r == nullptr) throw py::error_already_set();
    Py_DECREF(r);
  }
  static PyObject* interned(const char* s) {
    PyObject* o = PyUnicode_InternFromString(s);
    if (o == nullptr) throw py::error_already_set();
    return o;                        // kept for the process's life
  }
  struct Call {
    py::object memo, entries, dtypes, recorder, folder, acquire, release, clock, clock_acquire, clock_release;
  };

  bool takes(PyObject* item) const {
    if (item == Py_None) return true;
    if (!THPVariable_CheckExact(item) && reinterpret_cast<PyObject*>(Py_TYPE(item)) != param_.ptr()) return false;
    const at::Tensor& t = THPVariable_Unpack(item);
    return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && opdump::StatsMemo::takes(t);
  }

  // nin < 0: no inputs side; value == nullptr: no outputs side.
  void tap(int64_t index, PyObject* const* ins, Py_ssize_t nin, PyObject* value) {
    PyObject* const* outs = nullptr;
    Py_ssize_t nout = -1;
    bool python = state_ == kPython || index < 0 || static_cast<size_t>(index) >= op_names_.size() ||
                  (PySet_GET_SIZE(armed_.ptr()) > 0 && PySet_Contains(armed_.ptr(), tap_.ptr()) == 1);
    if (!python && value != nullptr) python = !opdump::output_items(&value, &outs, &nout);
    for (Py_ssize_t k = 0; !python && k < nin; ++k) python = !takes(ins[k]);
    for (Py_ssize_t k = 0; !python && k < nout; ++k) python = !takes(outs[k]);
    if (python) {
      to_python(index, ins, nin, value);
      return;
    }
    // strong references for the call: the memo releases the GIL while it reads, and a close or
    // release from another thread must not free what this call still uses
    const Call c{memo_obj_, entries_, dtypes_, recorder_, folder_, acquire_, release_, clock_, clock_acquire_,
                 clock_release_};
    opdump::StatsMemo* memo = memo_;
    bool locked = false;
    try {
      const Py_ssize_t total = (nin > 0 ? nin : 0) + (nout > 0 ? nout : 0);
      const int64_t ts = stamp(c, total);
      call0(c.acquire);
      locked = true;
      static PyObject* const pending_name = interned("_pending");
      py::object pending = py::reinterpret_steal<py::object>(PyObject_GetAttr(c.recorder.ptr(), pending_name));
      if (!pending) throw py::error_already_set();
      PyObject* rows = PyDict_GetItemWithError(pending.ptr(), c.folder.ptr());   // borrowed
      py::object fresh;
      if (rows == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        // the recorder's own container (a RowBatch, row_batch.h, or a list: Recorder._rows_of)
        static PyObject* const rows_of_name = interned("_rows_of");
        py::object rows_of = py::reinterpret_steal<py::object>(PyObject_GetAttr(c.recorder.ptr(), rows_of_name));
        if (rows_of) {
          fresh = rows_of(c.folder);
        } else {
          PyErr_Clear();
          fresh = py::list();
          if (PyDict_SetItem(pending.ptr(), c.folder.ptr(), fresh.ptr()) < 0) throw py::error_already_set();
        }
        rows = fresh.ptr();
      }
      py::object keep_rows = py::reinterpret_borrow<py::object>(rows);
      if (nin > 0) side(c, memo, rows, index, 0, input_, ins, nin, ts);
      if (nout > 0) side(c, memo, rows, index, 1, output_, outs, nout, ts + (nin > 0 ? nin : 0));
      locked = false;
      call0(c.release);
    } catch (py::error_already_set& e) {
      py::object exc = e.value();
      e.restore();
      PyErr_Clear();
      unlock(c, locked);
      failed(index, exc, value != nullptr);
    } catch (const std::exception& e) {
      unlock(c, locked);
      failed(index, py::reinterpret_steal<py::object>(PyObject_CallFunction(PyExc_RuntimeError, "s", e.what())),
             value != nullptr);
    }
  }

  // one side's rows (kind 0: inputs, 1: outputs), appended to `rows`
  void side(const Call& c, opdump::StatsMemo* memo, PyObject* rows, int64_t index, int kind, const py::object& io,
            PyObject* const* items, Py_ssize_t n, int64_t ts) {
    RowBatch* batch = opdump::row_batch_of(rows);
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = items[k];
      if (item == Py_None) continue;
      const at::Tensor& t = THPVariable_Unpack(item);
      PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
      const int64_t entry = static_cast<int64_t>(PyList_GET_SIZE(c.entries.ptr()));
      py::object handle = memo->stats(t, entry);
      if (handle.is_none()) throw std::logic_error("GraphTaps: the memo declined a tensor it takes");
      if (!PyLong_Check(handle.ptr())) {      // read now: a new entry of the batch
        if (PyList_Append(c.entries.ptr(), handle.ptr()) < 0 || PyList_Append(c.dtypes.ptr(), dtype) < 0) {
          throw py::error_already_set();
        }
        handle = py::reinterpret_steal<py::object>(int_of(entry));
        if (!handle) throw py::error_already_set();
      }
      const ShapeText& text = opdump::shape_of(shapes_[static_cast<size_t>(index) * 2 + kind], static_cast<size_t>(k), t);
      if (batch != nullptr) {          // a record (row_batch.h): no tuple, no int objects
        const long long h = PyLong_AsLongLong(handle.ptr());
        if (h == -1 && PyErr_Occurred()) throw py::error_already_set();
        batch->add(op_types_[index].ptr(), op_names_[index].ptr(), io.ptr(), ts + k, k, text, dtype, h);
        ++count_;
        continue;
      }
      py::tuple row(static_cast<size_t>(kRowFields));
      PyObject* r = row.ptr();
      auto put = [r](int field, PyObject* v, bool borrowed) {
        if (v == nullptr) throw py::error_already_set();
        if (borrowed) Py_INCREF(v);
        PyTuple_SET_ITEM(r, field, v);
      };
      put(kRowOpType, op_types_[index].ptr(), true);
      put(kRowOpName, op_names_[index].ptr(), true);
      put(kRowStream, zero_.ptr(), true);
      put(kRowTimestamp, PyLong_FromLongLong(ts + k), false);
      put(kRowIo, io.ptr(), true);
      put(kRowSlot, PyLong_FromSsize_t(k), false);
      put(kRowNbytes, text.nbytes.ptr(), true);
      put(kRowDtype, dtype, true);
      put(kRowShape, text.shape.ptr(), true);
      put(kRowHandle, handle.release().ptr(), false);
      put(kRowHostFuture, Py_None, true);
      PyObject_GC_UnTrack(r);         // ints, strs, a dtype, None: no cycle to find
      if (PyList_Append(rows, r) < 0) throw py::error_already_set();
      ++count_;
    }
  }

  // The int object of a batch entry's number (a row's statistics handle), kept for the taps' life:
  // entries number from 0 in every batch, so the same few hundred objects serve every step.
  PyObject* int_of(int64_t v) {
    if (v < 0 || v >= kIntCache) return PyLong_FromLongLong(v);
    if (static_cast<size_t>(v) >= ints_.size()) ints_.resize(static_cast<size_t>(v) + 1);
    py::object& cached = ints_[static_cast<size_t>(v)];
    if (!cached) {
      cached = py::reinterpret_steal<py::object>(PyLong_FromLongLong(v));
      if (!cached) throw py::error_already_set();
    }
    return cached.inc_ref().ptr();
  }
  static constexpr int64_t kIntCache = 1 << 16;

  // Clock.__call__(count): the first of `count` consecutive microsecond stamps, later than any given
  int64_t stamp(const Call& c, Py_ssize_t count) {
    const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now().time_since_epoch()).count();
    static PyObject* const last_name = interned("_last");
    call0(c.clock_acquire);
    int64_t first = now;
    try {
      py::object last_obj = py::reinterpret_steal<py::object>(PyObject_GetAttr(c.clock.ptr(), last_name));
      if (!last_obj) throw py::error_already_set();
      const long long last = PyLong_AsLongLong(last_obj.ptr());
      if (last == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (first <= last) first = last + 1;
      py::object value = py::reinterpret_steal<py::object>(PyLong_FromLongLong(first + count - 1));
      if (!value || PyObject_SetAttr(c.clock.ptr(), last_name, value.ptr()) < 0) throw py::error_already_set();
    } catch (...) {
      call0(c.clock_release);
      throw;
    }
    call0(c.clock_release);
    return first;
  }

  void unlock(const Call& c, bool locked) {
    if (!locked) return;
    try {
      call0(c.release);
    } catch (py::error_already_set&) {
      PyErr_Clear();
    }
  }

  // the runtime's Python taps take the call (they have their own error handling)
  void to_python(int64_t index, PyObject* const* ins, Py_ssize_t nin, PyObject* value) {
    try {
      if (!runtime_) return;
      py::object rt = runtime_();
      if (rt.is_none()) return;
      if (nin >= 0) {
        py::tuple in_tuple(static_cast<size_t>(nin));
        for (Py_ssize_t k = 0; k < nin; ++k) in_tuple[static_cast<size_t>(k)] = py::reinterpret_borrow<py::object>(ins[k]);
        rt.attr("tap_inputs")(index, in_tuple);
      }
      if (value != nullptr && state_ != kClosed) rt.attr("tap_outputs")(index, py::reinterpret_borrow<py::object>(value));
    } catch (py::error_already_set& e) {
      e.restore();
      PyErr_Clear();
    }
  }

  void failed(int64_t index, py::object exc, bool outputs) {
    state_ = kClosed;
    try {
      py::object rt = runtime_ ? runtime_() : py::none();
      if (rt.is_none()) return;
      std::string where = std::string(outputs ? "the outputs of " : "the inputs of ") +
                          (static_cast<size_t>(index) < op_names_.size() ? op_names_[index].cast<std::string>() : "?");
      rt.attr("_failed")(exc, where);
    } catch (py::error_already_set& e) {
      e.restore();
      PyErr_Clear();
    } catch (...) {
    }
  }

  py::object memo_obj_;            // keeps memo_ alive
  opdump::StatsMemo* memo_;
  py::object entries_, dtypes_, param_, armed_, runtime_;
  py::str tap_, input_, output_;
  py::int_ zero_;
  std::vector<py::object> op_types_, op_names_;
  std::vector<std::vector<ShapeText>> shapes_;  // per (op, side), per slot (row_batch.h shape_of)
  std::vector<py::object> ints_;                // int_of's objects, by value
  State state_ = kClosed;
  int64_t count_ = 0;
  int64_t iteration_ = -1;
  py::object recorder_, folder_, acquire_, release_, clock_, clock_acquire_, clock_release_;
};

}  // namespace

namespace opdump {

RowBatch* row_batch_of(PyObject* obj) {
  static PyTypeObject* const type = reinterpret_cast<PyTypeObject*>(py::type::of<RowBatch>().ptr());
  if (obj == nullptr || Py_TYPE(obj) != type) return nullptr;
  auto* inst = reinterpret_cast<py::detail::instance*>(obj);
  return inst->get_value_and_holder(nullptr, false).value_ptr<RowBatch>();
}

}  // namespace opdump

namespace {

// RowBatch's Python face: the list operations the recorder and the rows' readers use
void register_row_batch(py::module& m) {
  auto index_of = [](const RowBatch& b, Py_ssize_t i) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(b.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) throw py::index_error("RowBatch index out of range");
    return static_cast<size_t>(i);
  };
  auto rows_list = [](const RowBatch& b) {
    py::list out(b.size());
    for (size_t i = 0; i < b.size(); ++i) out[i] = b.row(i);
    return out;
  };
  auto extend = [](RowBatch& b, const py::iterable& rows) {
    for (py::handle r : rows) {
      if (!PyTuple_Check(r.ptr())) throw py::type_error("a RowBatch holds row tuples");
      b.add_tuple(r.ptr());
    }
  };
  py::class_<RowBatch>(m, "RowBatch", "statistic.csv rows queued for one folder, as C++ records (row_batch.h)")
      .def(py::init<>())
      .def("__len__", &RowBatch::size)
      .def("__bool__", [](const RowBatch& b) { return b.size() > 0; })
      .def("__getitem__", [index_of](const RowBatch& b, Py_ssize_t i) { return b.row(index_of(b, i)); })
      .def("__getitem__", [rows_list](const RowBatch& b, const py::slice& s) {
             py::list all = rows_list(b);
             return py::object(all[s]);
           })
      .def("__iter__", [rows_list](const RowBatch& b) { return py::iter(rows_list(b)); })
      .def("append", [](RowBatch& b, const py::tuple& row) { b.add_tuple(row.ptr()); }, "a row tuple, at the end")
      .def("extend", extend, "row tuples, at the end")
      .def("__iadd__", [extend](py::object self, const py::iterable& rows) {
             extend(self.cast<RowBatch&>(), rows);
             return self;
           })
      .def_property_readonly("records", &RowBatch::records, "how many rows are native records (not tuples)")
      .def("clear", &RowBatch::clear)
      .def("rows", rows_list, "every row as its tuple (a new list)");
}

}  // namespace

// cell_text.cpp: statistic.csv rows as text (registered here, beside the rows' makers)
py::object encode_rows(const py::object& rows, const py::list& cells, bool by_row, const py::str& empty,
                       const py::dict& names, const py::object& name_of);

void register_row_sink(py::module& m) {
  register_row_batch(m);
  m.def("encode_rows", &encode_rows, py::arg("rows"), py::arg("cells"), py::arg("by_row"), py::arg("empty"),
        py::arg("names"), py::arg("name_of"),
        "the statistic.csv text (UTF-8 bytes) of queued rows and their cells, or None (the Python path writes them)");
  py::class_<RowSink>(m, "RowSink")
      .def(py::init<py::object, py::object>(), py::arg("memo"), py::arg("parameter_type"))
      .def("record", &RowSink::record, py::arg("base"), py::arg("op_type"), py::arg("name"), py::arg("io"),
           py::arg("ts"), py::arg("tensors"),
           "(rows, entries, dtypes) of `tensors`, new lists, entries numbered from `base`; or None (nothing "
           "changed) when an element needs the Python path")
      .def("record_into", &RowSink::record_into, py::arg("batch"), py::arg("base"), py::arg("op_type"),
           py::arg("names"), py::arg("io"), py::arg("ts"), py::arg("tensors"),
           "record()'s rows appended to the RowBatch `batch` as records (`names`: the operator's name, or one "
           "name per tensor, each at slot 0): (count, entries, dtypes), or None (nothing changed)");

  py::class_<GraphTaps> taps(m, "GraphTaps");
  taps.def(py::init<py::object, py::list, py::list, py::object, py::list, py::object, py::object>(),
           py::arg("memo"), py::arg("entries"), py::arg("dtypes"), py::arg("parameter_type"), py::arg("names"),
           py::arg("armed"), py::arg("runtime_ref"))
      .def("open", &GraphTaps::open, py::arg("recorder"), py::arg("folder"), py::arg("native"), py::arg("iteration"))
      .def("close", &GraphTaps::close,
           "stop recording until the next open (a native call's values carried to its iteration's next calls); "
           "the tensors recorded since open")
      .def("release", &GraphTaps::release, "stop for good, dropping every reference")
      .def("inputs", &GraphTaps::inputs, "tap(index, *tensors): an operator's inputs, before it runs")
      .def("outputs", &GraphTaps::outputs, "tap(index, value): an operator's outputs, after it ran")
      .def("both", &GraphTaps::both, "tap(index, value, *inputs): inputs then outputs, after it ran")
      .def("fast", [](py::object self) { return GraphTaps::fast(self); },
           "(inputs, outputs, both) as builtins called without pybind11's dispatch, or None");
  taps.attr("graph_tap") = true;     // opdump.capture.graph.instrument.uninstrument removes its calls
}
