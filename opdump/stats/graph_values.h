// What a graph tap is handed as an operator's result (opdump/capture/graph/taps.py value_leaves):
// one tensor, or a tuple/list of them -- shared by the statistics taps (row_sink.cpp GraphTaps)
// and the overflow watch's tap (opdump/debug/graph_watch.cpp).
#pragma once

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

namespace opdump {

// The result the caller's variable `*value` holds, as a borrowed array of items (`*outs`, `*nout`;
// one tensor: `value` itself, so it must outlive their use); false for anything else (the caller
// hands the call to its Python tap).
inline bool output_items(PyObject* const* value, PyObject* const** outs, Py_ssize_t* nout) {
  PyObject* v = *value;
  if (THPVariable_Check(v)) {
    *outs = value;
    *nout = 1;
    return true;
  }
  if (PyTuple_Check(v) || PyList_Check(v)) {
    *outs = PySequence_Fast_ITEMS(v);
    *nout = PySequence_Fast_GET_SIZE(v);
    return true;
  }
  return false;
}

}  // namespace opdump
