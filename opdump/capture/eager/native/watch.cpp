// The native eager observer's overflow watch (op_debug_mode 3): see watch.h.
//
// Guarantees: the rule (opdump.debug.origin.judge) and the copy decision
// (opdump.debug.overflow_rules.needs_prewrite_copy) stay in Python; here an operator is only
// ever spared Python when every floating output it returns reads finite, which gives no
// verdict whatever its inputs hold.  A copy is private (an empty tensor of ours the pre-write
// bytes are copied into) and reused only when its operator was not handed to Python.
// Errors are thrown to the observer's guarded() (which turns the native path off).
#include "watch.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace opdump {
bool finite_read(const at::Tensor& x, double* value, bool* signed_out, bool nogil);   // stats/finite_bound.cpp

namespace watch {
namespace {

namespace py = pybind11;

constexpr int64_t kPoolBytes = int64_t(256) << 20;   // free copy buffers kept (overflow_copies.POOL_BYTES)
constexpr size_t kPerShape = 4;

struct Known {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;   // keeps the address from being reused
  int64_t version;
  c10::ScalarType dtype;         // as read (a view as another dtype reads other values)
  double b, l;                   // facts (overflow_bounds): |x| <= b, x >= l; NaN: not known
};

struct Settings {
  py::object kind_cb, bound_cb, add_cb;
  std::unordered_map<const c10::StorageImpl*, Known> known;   // storages read finite (see watch.h)
  std::unordered_set<std::string> to_python;
  std::unordered_map<std::string, int> decisions;      // (overload, numbers) -> kind bits
  std::unordered_map<std::string, std::vector<at::Tensor>> pool;   // (shape, dtype) -> free buffers
  int64_t pool_bytes = 0;
  int64_t read = 0, handed = 0, copied = 0;
};

Settings* s = nullptr;

bool floating(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

std::string shape_key(const at::Tensor& t) {
  std::string k(reinterpret_cast<const char*>(t.sizes().data()), t.sizes().size() * sizeof(int64_t));
  k += static_cast<char>(t.scalar_type());
  return k;
}

void put(std::string& key, const void* p, size_t n) { key.append(static_cast<const char*>(p), n); }

bool plain_storage(const at::Tensor& t) {
  return t.defined() && t.has_storage() && !t.is_inference() && t.layout() == at::kStrided &&
         !t.key_set().has(c10::DispatchKey::Python);
}

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

const Known* known_of(const at::Tensor& t) {
  if (!plain_storage(t)) return nullptr;
  const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  auto it = s->known.find(st);
  if (it == s->known.end()) return nullptr;
  if (it->second.storage.expired()) {
    s->known.erase(it);
    return nullptr;
  }
  return it->second.version == t._version() && it->second.dtype == t.scalar_type() ? &it->second : nullptr;
}

bool is_known(const at::Tensor& t) { return known_of(t) != nullptr; }

// `t` holds only finite values (facts b, l; NaN: not known): its storage is known finite when
// `t` covers all of it
void mark(const at::Tensor& t, double b = kUnknown, double l = kUnknown) {
  if (!plain_storage(t) || t.storage_offset() != 0 || !t.is_non_overlapping_and_dense()) return;
  const c10::Storage& st = t.storage();
  if (static_cast<size_t>(t.numel()) * t.element_size() != st.nbytes()) return;
  if (s->known.size() > 100000) s->known.clear();     // bounded (cleared every iteration anyway)
  s->known.insert_or_assign(st.unsafeGetStorageImpl(), Known{st.getWeakStorageImpl(), t._version(), t.scalar_type(), b, l});
}

// the floating tensors among `v` whose facts are not known (false: one that cannot be read here)
bool missing_facts(const c10::IValue& v, std::vector<at::Tensor>& missing) {
  auto one = [&missing](const at::Tensor& t) {
    if (!t.defined() || !floating(t.scalar_type()) || t.numel() == 0 || t.unsafeGetTensorImpl()->is_wrapped_number())
      return true;
    const Known* k = known_of(t);
    if (k != nullptr && !std::isnan(k->b)) return true;
    if (!t.device().is_cpu()) return false;
    missing.push_back(t);
    return true;
  };
  if (v.isTensor()) return one(v.toTensor());
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (!one(t)) return false;
    return true;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (!missing_facts(e, missing)) return false;
  }
  return true;
}

bool input_known(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !floating(t.scalar_type()) || t.numel() == 0 || t.unsafeGetTensorImpl()->is_wrapped_number())
      return true;
    return is_known(t);
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (t.defined() && floating(t.scalar_type()) && t.numel() && !is_known(t)) return false;
    return true;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (!input_known(e)) return false;
  }
  return true;
}

// the value item().toDouble() gives of a 0-d CPU tensor, read in place for the dtypes a Python
// number becomes (item() is two dispatcher calls, each seen by the observer: the bench AlexNet's
// SGD momentum mul_ asked it 16 times a step); other dtypes ask item()
double number_of(const at::Tensor& t) {
  if (t.layout() == c10::kStrided && t.has_storage()) {
    switch (t.scalar_type()) {
      case at::kDouble: return *t.const_data_ptr<double>();
      case at::kFloat: return static_cast<double>(*t.const_data_ptr<float>());
      case at::kLong: return static_cast<double>(*t.const_data_ptr<int64_t>());
      case at::kBool: return *t.const_data_ptr<bool>() ? 1.0 : 0.0;
      default: break;
    }
  }
  return t.item().toDouble();
}

// a number argument's bytes in the decision's key (what the rules can depend on: the operator,
// a non-finite or extreme number, the scale of mul/div -- its second argument)
void key_of(std::string& key, const c10::IValue& v, size_t position) {
  if (v.isDouble()) {
    const double d = v.toDouble();
    key += 'd';
    put(key, &d, sizeof d);
  } else if (v.isInt()) {
    const int64_t i = v.toInt();
    key += 'i';
    put(key, &i, sizeof i);
  } else if (v.isBool()) {
    key += v.toBool() ? 'T' : 'F';
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.dim() == 0 && t.device().is_cpu() && !t.is_complex() && !t.requires_grad() &&
        (position == 1 || t.unsafeGetTensorImpl()->is_wrapped_number())) {
      // a number (wrapped, or the 0-d CPU tensor scales_down reads): its value
      const double d = number_of(t);
      key += t.unsafeGetTensorImpl()->is_wrapped_number() ? 'w' : 'z';
      put(key, &d, sizeof d);
    } else {
      key += 't';
    }
  } else if (v.isDoubleList()) {
    key += 'D';
    for (double d : v.toDoubleList()) put(key, &d, sizeof d);
    key += ']';
  } else if (v.isNone()) {
    key += 'n';
  } else {
    key += '?';
  }
}

at::Tensor copy_of(const at::Tensor& t) {
  ++s->copied;
  if (t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() && !t.is_neg() &&
      !t.key_set().has(c10::DispatchKey::Python)) {
    const std::string key = shape_key(t);
    at::Tensor buf;
    auto it = s->pool.find(key);
    if (it != s->pool.end() && !it->second.empty()) {
      buf = std::move(it->second.back());
      it->second.pop_back();
      s->pool_bytes -= static_cast<int64_t>(buf.nbytes());
    } else {
      buf = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
    }
    if (t.nbytes()) std::memcpy(buf.mutable_data_ptr(), t.const_data_ptr(), t.nbytes());
    return buf;
  }
  at::NoGradGuard no_grad;
  return t.detach().clone();
}

}  // namespace

void configure(py::object kind_cb, py::object bound_cb, py::object add_cb, const std::vector<std::string>& to_python) {
  if (s == nullptr) s = new Settings();      // lives for the process, as the observer's state
  s->kind_cb = std::move(kind_cb);
  s->bound_cb = std::move(bound_cb);
  s->add_cb = std::move(add_cb);
  std::unordered_set<std::string> types(to_python.begin(), to_python.end());
  if (types != s->to_python) s->decisions.clear();      // they hold kPython
  s->to_python = std::move(types);
  // the decisions are kept: they depend on the overload (the observer's, never freed) and the
  // numbers alone, and a capture started again (each step, in the bench) would ask them again
  s->known.clear();
}

void new_iteration() {
  if (s != nullptr) s->known.clear();
}

bool inputs_finite(c10::ArrayRef<c10::IValue> inputs) {
  for (const c10::IValue& v : inputs)
    if (!input_known(v)) return false;
  return true;
}

void known_outputs(const std::vector<c10::optional<at::Tensor>>& outs, double b, double l) {
  for (const auto& o : outs)
    if (o && o->defined() && floating(o->scalar_type())) mark(*o, b, l);
}

py::object facts(const at::Tensor& t) {
  const Known* k = s != nullptr ? known_of(t) : nullptr;
  if (k == nullptr || std::isnan(k->b)) return py::none();
  return py::make_tuple(k->b, k->l);
}

bool prove(InFlight& op, const char* qualname, const char* overload_name, c10::ArrayRef<c10::IValue> inputs,
           const std::vector<c10::optional<at::Tensor>>& outs, const std::function<py::list()>& values) {
  int64_t n = 0;
  for (const auto& o : outs)
    if (o && o->defined()) n += o->numel();
  if (n < (op.written_at_start ? kProveWritten : kProveOutputs)) return false;
  // arguments whose facts are not known yet are read now when they hold at most twice the
  // elements (the copy and the reading a proof saves; overflow_now.CpuPath._prove_before's
  // policy); one not finite: no rule applies
  std::vector<at::Tensor> missing;
  for (const c10::IValue& v : inputs)
    if (!missing_facts(v, missing)) return false;
  int64_t m = 0;
  for (const at::Tensor& t : missing) m += t.numel();
  if (m > 2 * n) return false;
  for (const at::Tensor& t : missing) {
    if (known_of(t) != nullptr && !std::isnan(known_of(t)->b)) continue;     // listed twice
    double value = 0.0;
    bool is_signed = false;
    if (!finite_read(t, &value, &is_signed, false)) return false;
    ++s->read;
    if (!std::isfinite(value)) return false;
    // known only when `t` covers its storage (mark); else its facts serve this proof alone
    mark(t, value, is_signed ? -value : 0.0);
    if (known_of(t) == nullptr) return false;
  }
  py::gil_scoped_acquire gil;
  py::list items;
  for (const auto& o : outs)
    items.append(o ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*o)) : py::none());
  at::RecordFunctionGuard off(false);
  py::object got = s->bound_cb(py::str(qualname), py::str(overload_name), values(), items);
  if (got.is_none()) return false;
  auto t = got.cast<py::tuple>();
  op.proven = true;
  op.b = t[0].cast<double>();
  op.l = t[1].cast<double>();
  return true;
}

void clear() {
  if (s != nullptr) {
    s->pool.clear();
    s->pool_bytes = 0;
  }
}

int decide(const void* overload, const std::string& op_type, const char* qualname, const char* overload_name,
           c10::ArrayRef<c10::IValue> inputs, const std::function<py::list()>& values) {
  std::string key;
  put(key, &overload, sizeof overload);
  for (size_t i = 0; i < inputs.size(); ++i) key_of(key, inputs[i], i);
  auto it = s->decisions.find(key);
  if (it != s->decisions.end()) return it->second;
  py::gil_scoped_acquire gil;
  const int kind = s->to_python.count(op_type) ? kPython
                                               : s->kind_cb(py::str(qualname), py::str(overload_name), values()).cast<int>();
  if (s->decisions.size() > 4096) s->decisions.clear();    // numbers that change every step: bounded
  s->decisions.emplace(std::move(key), kind);
  return kind;
}

void start(InFlight& op, c10::ArrayRef<c10::IValue> inputs, const std::vector<at::Tensor>& written, bool copy) {
  op.inputs.assign(inputs.begin(), inputs.end());
  if (!copy) return;
  for (const at::Tensor& t : written) {
    bool seen = false;
    for (const at::Tensor& o : op.originals) seen = seen || o.is_same(t);
    if (seen || !t.defined()) continue;
    op.originals.push_back(t);
    op.copies.push_back(copy_of(t));
  }
}

bool finite(const std::vector<c10::optional<at::Tensor>>& outs) {
  for (const auto& o : outs) {
    if (!o || !o->defined()) continue;
    const at::Tensor& t = *o;
    if (t.key_set().has(c10::DispatchKey::Python)) return false;     // a subclass: Python reads it
    if (!floating(t.scalar_type())) continue;   // the watch judges fp16/bf16/fp32/fp64 only
    if (t.numel() == 0 || is_known(t)) continue;
    double value = 0.0;
    bool is_signed = false;
    if (!finite_read(t, &value, &is_signed, false)) return false;   // not dense / not CPU: Python reads it
    ++s->read;
    if (!std::isfinite(value)) return false;
    mark(t, value, is_signed ? -value : 0.0);
  }
  return true;
}

void recycle(InFlight& op) {
  for (at::Tensor& c : op.copies) {
    const int64_t n = static_cast<int64_t>(c.nbytes());
    if (!c.device().is_cpu() || !c.is_contiguous() || c.use_count() != 1 || s->pool_bytes + n > kPoolBytes) continue;
    auto& slot = s->pool[shape_key(c)];
    if (slot.size() < kPerShape) {
      slot.push_back(std::move(c));
      s->pool_bytes += n;
    }
  }
  op.copies.clear();
  op.originals.clear();
  op.inputs.clear();
}

void hand_over(InFlight& op, int64_t index, const py::object& name, const char* qualname, const char* overload_name,
               const py::list& values, const std::vector<c10::optional<at::Tensor>>& flat_in,
               const std::vector<c10::optional<at::Tensor>>& outs) {
  ++s->handed;
  auto wrap = [](const at::Tensor& t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(t)); };
  py::list saved, outputs, cloned;
  for (const auto& t : flat_in) {
    if (!t) continue;
    size_t k = 0;
    while (k < op.originals.size() && !op.originals[k].is_same(*t)) ++k;
    saved.append(wrap(k < op.originals.size() ? op.copies[k] : *t));
  }
  for (const at::Tensor& c : op.copies) cloned.append(wrap(c));
  for (const auto& t : outs) outputs.append(t ? wrap(*t) : py::none());
  op.copies.clear();        // Python holds them now (recorded, or judged and dropped)
  op.originals.clear();
  op.inputs.clear();
  at::RecordFunctionGuard off(false);     // the watch's torch calls are opdump's own
  s->add_cb(index, name, py::str(qualname), py::str(overload_name), values, saved, outputs, cloned);
}

std::vector<int64_t> take_counts() {
  std::vector<int64_t> out{s ? s->read : 0, s ? s->handed : 0, s ? s->copied : 0};
  if (s) s->read = s->handed = s->copied = 0;
  return out;
}

}  // namespace watch
}  // namespace opdump
