// The native eager observer's view of values as the Python capture sees them: an operator's
// arguments as a dispatch mode receives them (python_args), the tensors the capture flattens
// them to (flat), its outputs as it lists them (outputs_of), and whether a number argument is
// an Inf/NaN or a dtype's largest value (nonfinite_scalar).
// Guarantees: values follow torch's parseIValuesToPyArgsKwargs and opdump/capture/eager/
// dispatch.py (see each function); the helpers that make Python objects run with the GIL held.
#include "observer_state.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <cmath>

namespace opdump {
namespace eager_observer {
namespace {

// a Python number torch wrapped into a 0-d tensor (mul_(2.0)): a dispatch mode receives the number
bool wrapped_number(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number();
}

// an argument as a dispatch mode receives it (torch's parseIValuesToPyArgsKwargs: dtype, layout and
// memory format arguments, ints in the IValue, become their Python objects)
py::object to_python(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) return py::none();
  if (wrapped_number(v)) return torch::jit::toPyObject(c10::IValue(v.toTensor().item()));
  c10::TypePtr t = arg.real_type();
  if (t->kind() == c10::OptionalType::Kind) t = t->castRaw<c10::OptionalType>()->getElementType();
  if (v.isInt()) {
    if (t->kind() == c10::ScalarTypeType::Kind) {
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
    }
    if (t->kind() == c10::LayoutType::Kind) {
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
    }
    if (t->kind() == c10::MemoryFormatType::Kind) {
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
    }
  }
  return torch::jit::toPyObject(v);
}

// the value of a floating wrapped number (a Python float torch made a 0-d CPU tensor of, double
// as a rule), read in place: item() is two dispatcher calls, ~90 a step on the bench's decoder
double wrapped_double(const at::Tensor& t) {
  if (t.device().is_cpu()) {
    switch (t.scalar_type()) {
      case at::kDouble: return *t.const_data_ptr<double>();
      case at::kFloat: return static_cast<double>(*t.const_data_ptr<float>());
      default: break;
    }
  }
  return t.item().toDouble();
}

}  // namespace

// the arguments as a dispatch mode receives them, in schema order (GIL held)
py::list python_args(const at::RecordFunction& fn, c10::ArrayRef<c10::IValue> inputs) {
  py::list args;
  const auto schema = fn.operator_schema();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (schema && i < schema->arguments().size()) args.append(to_python(schema->arguments()[i], inputs[i]));
    else args.append(torch::jit::toPyObject(inputs[i]));
  }
  return args;
}

bool nonfinite_scalar(const c10::IValue& v) {
  auto bad = [](double x) {
    double a = std::fabs(x);
    return x != x || std::isinf(x) || a == 65504.0 || a == 3.3895313892515355e+38 || a == 3.4028234663852886e+38 ||
           a == 1.7976931348623157e+308;
  };
  if (v.isDouble()) return bad(v.toDouble());
  if (wrapped_number(v) && c10::isFloatingType(v.toTensor().scalar_type())) return bad(wrapped_double(v.toTensor()));
  if (v.isDoubleList()) {
    for (double x : v.toDoubleList()) if (bad(x)) return true;
  }
  return false;
}

void flat(const c10::IValue& v, std::vector<c10::optional<at::Tensor>>& out) {
  if (v.isTensor()) {
    if (v.toTensor().defined() && !wrapped_number(v)) out.emplace_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) if (t.defined()) out.emplace_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) flat(e, out);
  }
}


// an operator's outputs as the Python capture lists them (dispatch.py: the written arguments of
// an operator returning nothing, else each returned slot)
std::vector<c10::optional<at::Tensor>> outputs_of(const at::RecordFunction& fn, const Ctx* c) {
  std::vector<c10::optional<at::Tensor>> outs;
  if (c->ov->mutated) {
    for (const at::Tensor& t : c->written) outs.emplace_back(t);
    return outs;
  }
  const auto& outputs = fn.outputs();
  bool plain = true;
  for (const c10::IValue& v : outputs) plain = plain && (v.isTensor() || v.isNone());
  if (outputs.size() == 1 && outputs[0].isTensorList()) {
    for (const at::Tensor& t : outputs[0].toTensorList()) outs.emplace_back(t);
  } else if (plain) {
    for (const c10::IValue& v : outputs) {
      if (v.isTensor() && v.toTensor().defined()) outs.emplace_back(v.toTensor());
      else outs.emplace_back(c10::nullopt);
    }
  } else {
    for (const c10::IValue& v : outputs) flat(v, outs);
  }
  return outs;
}

}  // namespace eager_observer
}  // namespace opdump
