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
#include "stats_memo.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <stdexcept>
#include <string>

namespace {

namespace py = pybind11;
using namespace opdump::contract;

std::string shape_text(c10::IntArrayRef sizes) {   // formatting.format_shape: "(2,3)", "(5)", "()"
  std::string s = "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(sizes[i]);
  }
  s += ')';
  return s;
}

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
    PyObject* param = parameter_type_.ptr();
    for (Py_ssize_t k = 0; k < n; ++k) {     // first: is every element one this path takes?
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      if (!THPVariable_CheckExact(item) && reinterpret_cast<PyObject*>(Py_TYPE(item)) != param) return py::none();
      const at::Tensor& t = THPVariable_Unpack(item);
      if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() || !opdump::StatsMemo::takes(t)) {
        return py::none();
      }
    }
    py::list rows, entries, dtypes;
    py::int_ zero(0);
    py::none none;
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      const at::Tensor& t = THPVariable_Unpack(item);
      py::object dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())));
      const int64_t index = base + static_cast<int64_t>(py::len(entries));
      py::object handle = memo_->stats(t, index);
      if (handle.is_none()) throw std::logic_error("RowSink: the memo declined a tensor it takes");
      if (!PyLong_Check(handle.ptr())) {      // read now: a new entry of the batch
        entries.append(handle);
        dtypes.append(dtype);
        handle = py::int_(index);
      }
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

 private:
  py::object memo_obj_;            // keeps memo_ alive
  opdump::StatsMemo* memo_;
  py::object parameter_type_;
};

}  // namespace

void register_row_sink(py::module& m) {
  py::class_<RowSink>(m, "RowSink")
      .def(py::init<py::object, py::object>(), py::arg("memo"), py::arg("parameter_type"))
      .def("record", &RowSink::record, py::arg("base"), py::arg("op_type"), py::arg("name"), py::arg("io"),
           py::arg("ts"), py::arg("tensors"),
           "(rows, entries, dtypes) of `tensors`, new lists, entries numbered from `base`; or None (nothing "
           "changed) when an element needs the Python path");
}
