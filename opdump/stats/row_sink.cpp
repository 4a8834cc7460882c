// The recorder's device-statistics fast path for CPU tensors, in C++.
//
// Why: with statistics on the device only, recording an operator's tensors is a
// statistic.csv row per tensor plus a statistics lookup — ~1 us of Python per tensor
// and ~3 us per operator side around it (attribute reads, a tuple of eleven fields, the
// batch's bookkeeping), more than the memo's own work once a tensor has been read.
//
// Guarantees of `RowSink.record(rows, op_type, name, io, ts, tensors)` (tested in
// tests/test_row_sink.py against Recorder.record_all's Python loop):
// * it appends to `rows` exactly the tuples that loop appends — per tensor at slot k
//   (None slots skipped): (op_type, name, 0, ts + k, io, k, nbytes, dtype, shape text,
//   statistics handle, None) — and returns how many;
// * the handle is the batch's: the memo's entry for memory already read, or a new entry
//   (the kernel's tuple appended to the batch's `entries`, its dtype to `dtypes`); a
//   tensor the memo declines goes to `launch` (the batch's Python `add`);
// * it takes the call only when every element is None or a CPU strided tensor of type
//   torch.Tensor or torch.nn.Parameter; otherwise it returns -1 having appended nothing,
//   and the Python loop (which knows the other cases) records them.
#include "stats_memo.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

namespace {

namespace py = pybind11;

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
  RowSink(py::object memo, py::list entries, py::list dtypes, py::object launch, py::object parameter_type)
      : memo_obj_(std::move(memo)), memo_(memo_obj_.cast<opdump::StatsMemo*>()), entries_(std::move(entries)),
        dtypes_(std::move(dtypes)), launch_(std::move(launch)), parameter_type_(std::move(parameter_type)) {}

  int64_t record(py::list rows, py::object op_type, py::object name, py::object io, int64_t ts,
                 py::object tensors) {
    // a list or tuple is used as it is (PySequence_Fast returns it with a new reference)
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(tensors.ptr(), "tensors must be a sequence"));
    if (!seq) throw py::error_already_set();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject* param = parameter_type_.ptr();
    for (Py_ssize_t k = 0; k < n; ++k) {     // first: is every element one this path takes?
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      if (!THPVariable_CheckExact(item) && reinterpret_cast<PyObject*>(Py_TYPE(item)) != param) return -1;
      const at::Tensor& t = THPVariable_Unpack(item);
      if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu()) return -1;
    }
    int64_t recorded = 0;
    py::int_ zero(0);
    py::none none;
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), k);
      if (item == Py_None) continue;
      const at::Tensor& t = THPVariable_Unpack(item);
      py::object dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())));
      const int64_t index = static_cast<int64_t>(py::len(entries_));
      py::object handle = memo_->stats(t, index);
      if (handle.is_none()) {
        handle = launch_(py::handle(item));
      } else if (!PyLong_Check(handle.ptr())) {      // read now: a new entry of the batch
        entries_.append(handle);
        dtypes_.append(dtype);
        handle = py::int_(index);
      }
      const int64_t slot = static_cast<int64_t>(k);
      rows.append(py::make_tuple(op_type, name, zero, ts + slot, io, slot, t.numel() * t.element_size(), dtype,
                                 shape_text(t.sizes()), handle, none));
      ++recorded;
    }
    return recorded;
  }

 private:
  py::object memo_obj_;            // keeps memo_ alive
  opdump::StatsMemo* memo_;
  py::list entries_;
  py::list dtypes_;
  py::object launch_;
  py::object parameter_type_;
};

}  // namespace

void register_row_sink(py::module& m) {
  py::class_<RowSink>(m, "RowSink")
      .def(py::init<py::object, py::list, py::list, py::object, py::object>(),
           py::arg("memo"), py::arg("entries"), py::arg("dtypes"), py::arg("launch"), py::arg("parameter_type"))
      .def("record", &RowSink::record,
           "append the statistic.csv row tuples of `tensors` to `rows`; how many, or -1 (nothing appended) "
           "when an element needs the Python path");
}
