// The statistics of CPU tensors already read in one batch, found by the memory they read.
//
// Why: a dump reads the same memory again and again — an operator's output is the
// next one's input, views (`t`, `transpose`, `unbind`, `detach`…) read their base's
// elements — and deciding in Python that a tensor was seen cost ~5 us per tensor
// (a permuted view to find its memory order, a key tuple, a weakref), and for a
// tensor with gaps (q/k/v split out of one projection) a copy before the lookup.
// One call here looks the tensor up and reads it only when it is new.
//
// Guarantees (tested in tests/test_stats_memo.py against the kernel and numpy):
// * `stats(t, index)` gives (max, min, sum, sum of squares, numel) exactly as
//   `fused_stats` (`host_stats` for a memo made with host=True) of the same elements and remembers `index` (the caller's batch
//   entry) for them; or the index remembered for a tensor reading the same memory; or
//   None for a tensor the kernel does not handle (not CPU, empty, negative/conjugate
//   bit, a dtype it lacks, or with gaps and over 32 MiB: `takes(t)` is false): the caller
//   uses torch for it;
// * reuse only when the earlier tensor is still alive (so its memory cannot have been
//   reused), reads the same memory (dense: same first element, count and dtype; with
//   gaps: also the same sizes and strides) and its version counter value is the
//   current tensor's (no in-place write since; inference tensors, which have no
//   counter, are never reused);
// * across batches, only within one iteration and only when asked: `carry(entries, tag)` (the
//   graph taps' close, opdump/stats/row_sink.cpp GraphTaps) keeps the values of the batch's
//   entries; after `enter(tag)` with the same tag (the next graph call of that iteration: a
//   backward reading the tensors its forward saved) a tensor found there under the same rules
//   (alive, same memory, same version) gets those values back as a new entry of the current
//   batch, exactly what reading it again would give, without the read; `enter` with another
//   tag drops them; lookups between `carry` and `enter` do not use them;
// * a tensor with gaps of at most 32 MiB is gathered, in row-major order (the order
//   `t.contiguous()` gives, so the sums are those of the contiguous copy bit for bit), into a
//   buffer of the calling thread and read in one pass: no torch call, so no dispatcher and no
//   RecordFunction callback runs for it (the copy through torch cost ~6 us a tensor, a third
//   of the kernel's time on a Llama decoder's rotary halves);
// * the GIL is released while gathering and while reading more than 256 KiB (cpu_kernel.cpp); the
//   map is only touched with it held.
#include "stats_memo.h"

#include "contract.h"

#include <cstring>
#include <functional>

pybind11::object fused_stats(const at::Tensor& x);   // cpu_kernel.cpp
pybind11::object host_stats(const at::Tensor& x);    // cpu_kernel.cpp

namespace opdump {

namespace {

using opdump::contract::kCopyLimit;   // bytes; Python's contract.COPY_LIMIT

bool handled(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || t.numel() == 0 ||
      t.is_neg() || t.is_conj()) {
    return false;
  }
  switch (t.scalar_type()) {
    case at::kFloat: case at::kBFloat16: case at::kHalf: case at::kBool: case at::kByte:
    case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kUInt16: case at::kUInt32:
      return true;
    default:
      return false;
  }
}

// the version counter read from the TensorImpl (Tensor::_version() goes through the autograd
// hooks' virtual call); -1 for a tensor with none (inference tensors: never reused)
int64_t version_of(const at::Tensor& t) {
  const c10::VariableVersion& v = t.unsafeGetTensorImpl()->version_counter();
  return v.enabled() ? static_cast<int64_t>(v.current_version()) : -1;
}

constexpr int64_t kNoGilBytes = 256 * 1024;   // as cpu_kernel.cpp: a larger gather lets other threads run

// the elements of `t` (not dense) in row-major order into `out` (numel * element_size bytes):
// size-1 dimensions dropped, neighbours that are contiguous with each other merged, then the
// innermost dimension copied for each position of the outer ones.  Its element loop is kept a
// loop (GCC would make it a memcpy call: ~5 ns each, most of the time for the short rows a
// rotary half has)
#if defined(__GNUC__) && !defined(__clang__)
#define OPDUMP_INLINE_COPY __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define OPDUMP_INLINE_COPY
#endif
// rows of B bytes (a constant: one or two vector moves each) `stride` elements apart
template <size_t B, typename E>
void rows_fixed(const E* src, int64_t rows, int64_t stride, E* out) {
  char* o = reinterpret_cast<char*>(out);
  for (int64_t r = 0; r < rows; ++r, src += stride, o += B) __builtin_memcpy(o, src, B);
}

template <typename E>
OPDUMP_INLINE_COPY void gather_typed(const E* src, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, E* out) {
  const size_t d = sizes.size();
  if (d == 0) {
    *out = *src;
    return;
  }
  const int64_t inner = sizes[d - 1], step = strides[d - 1];
  if (d == 2 && step == 1) {      // the common case once merged: short contiguous rows (a rotary half)
    switch (inner * static_cast<int64_t>(sizeof(E))) {
      case 8: return rows_fixed<8>(src, sizes[0], strides[0], out);
      case 16: return rows_fixed<16>(src, sizes[0], strides[0], out);
      case 32: return rows_fixed<32>(src, sizes[0], strides[0], out);
      case 64: return rows_fixed<64>(src, sizes[0], strides[0], out);
      case 128: return rows_fixed<128>(src, sizes[0], strides[0], out);
      default: break;
    }
  }
  std::vector<int64_t> idx(d - 1, 0);
  int64_t off = 0;
  for (;;) {
    const E* p = src + off;
    if (step == 1 && inner * static_cast<int64_t>(sizeof(E)) >= 256) {
      std::memcpy(out, p, static_cast<size_t>(inner) * sizeof(E));
    } else if (step == 1) {
      for (int64_t i = 0; i < inner; ++i) out[i] = p[i];
    } else {
      for (int64_t i = 0; i < inner; ++i) out[i] = p[i * step];
    }
    out += inner;
    int64_t k = static_cast<int64_t>(d) - 2;
    for (; k >= 0; --k) {
      if (++idx[k] < sizes[k]) {
        off += strides[k];
        break;
      }
      off -= strides[k] * (sizes[k] - 1);
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

void gather(const at::Tensor& t, char* out) {
  std::vector<int64_t> sizes, strides;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) == 1) continue;
    if (!sizes.empty() && strides.back() == t.size(i) * t.stride(i)) {
      sizes.back() *= t.size(i);
      strides.back() = t.stride(i);
    } else {
      sizes.push_back(t.size(i));
      strides.push_back(t.stride(i));
    }
  }
  const void* src = t.const_data_ptr();
  switch (t.element_size()) {
    case 1: gather_typed(static_cast<const uint8_t*>(src), sizes, strides, reinterpret_cast<uint8_t*>(out)); break;
    case 2: gather_typed(static_cast<const uint16_t*>(src), sizes, strides, reinterpret_cast<uint16_t*>(out)); break;
    case 4: gather_typed(static_cast<const uint32_t*>(src), sizes, strides, reinterpret_cast<uint32_t*>(out)); break;
    default: gather_typed(static_cast<const uint64_t*>(src), sizes, strides, reinterpret_cast<uint64_t*>(out)); break;
  }
}

// the thread's gather buffer (the GIL may be released while it is filled and read: per thread),
// kept for the small tensors a step reads again and again; a larger one gets its own for the read
constexpr int64_t kKeptBuffer = 1 << 20;
std::vector<char>& gather_buffer() {
  thread_local std::vector<char> buffer;
  return buffer;
}

MemoKey key_of(const at::Tensor& t, bool dense) {
  MemoKey k{reinterpret_cast<uintptr_t>(t.data_ptr()), t.numel(), static_cast<int>(t.scalar_type()), {}};
  if (!dense) {
    k.geometry.assign(t.sizes().begin(), t.sizes().end());
    k.geometry.insert(k.geometry.end(), t.strides().begin(), t.strides().end());
  }
  return k;
}

}  // namespace

size_t MemoKeyHash::operator()(const MemoKey& k) const {
  size_t h = std::hash<uintptr_t>()(k.ptr);
  h ^= std::hash<int64_t>()(k.numel) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= std::hash<int>()(k.dtype) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  for (int64_t g : k.geometry) h ^= std::hash<int64_t>()(g) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

bool StatsMemo::takes(const at::Tensor& t) {
  return handled(t) && (t.is_non_overlapping_and_dense() || t.numel() * t.element_size() <= kCopyLimit);
}

pybind11::object StatsMemo::stats(const at::Tensor& t, int64_t index) {
  if (!takes(t)) return pybind11::none();
  const bool dense = t.is_non_overlapping_and_dense();
  const int64_t version = version_of(t);
  MemoKey key = key_of(t, dense);
  auto it = map_.find(key);
  if (it != map_.end() && version >= 0 && it->second.version == version && !it->second.tensor.expired()) {
    return pybind11::int_(it->second.index);
  }
  if (carry_on_ && version >= 0 && !carried_.empty()) {      // read in an earlier call of this iteration
    auto c = carried_.find(key);
    if (c != carried_.end() && c->second.version == version && !c->second.tensor.expired()) {
      pybind11::object value = c->second.value;
      map_.insert_or_assign(std::move(key),
                            MemoEntry{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), version, index});
      return value;
    }
  }
  pybind11::object fused;
  if (dense) {
    fused = host_ ? host_stats(t) : fused_stats(t);
  } else {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    std::vector<char> own;
    std::vector<char>& buffer = bytes <= kKeptBuffer ? gather_buffer() : own;
    if (buffer.size() < static_cast<size_t>(bytes)) buffer.resize(static_cast<size_t>(bytes));
    if (bytes > kNoGilBytes) {
      pybind11::gil_scoped_release no_gil;
      gather(t, buffer.data());
    } else {
      gather(t, buffer.data());
    }
    // a tensor over the buffer (no dispatcher call): the kernel reads it as the contiguous copy
    at::Tensor copy = at::from_blob(buffer.data(), {t.numel()},
                                    at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
    fused = host_ ? host_stats(copy) : fused_stats(copy);
  }
  if (fused.is_none()) return fused;
  ++reads_;
  using namespace opdump::contract;
  // (max, min, sum, sum of squares) and the count, as one tuple made with the C API
  PyObject* parts = fused.ptr();
  if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) < kFieldNumel) throw std::logic_error("the kernel's tuple");
  PyObject* raw = PyTuple_New(static_cast<Py_ssize_t>(kFusedFields));
  if (raw == nullptr) throw pybind11::error_already_set();
  pybind11::object value = pybind11::reinterpret_steal<pybind11::object>(raw);
  for (Py_ssize_t f = kFieldMax; f < kFieldNumel; ++f) {
    PyObject* item = PyTuple_GET_ITEM(parts, f);
    Py_INCREF(item);
    PyTuple_SET_ITEM(raw, f, item);
  }
  PyObject* numel = PyLong_FromLongLong(t.numel());
  if (numel == nullptr) throw pybind11::error_already_set();
  PyTuple_SET_ITEM(raw, kFieldNumel, numel);
  PyObject_GC_UnTrack(raw);     // numbers only: no cycle (one tuple per tensor read, ~350 a step)
  map_.insert_or_assign(std::move(key),
                        MemoEntry{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), version, index});
  return value;
}

// `t` is being written in place: nothing computed from its memory is reused.
void StatsMemo::forget(const at::Tensor& t) {
  if (!handled(t)) return;
  map_.erase(key_of(t, true));
  map_.erase(key_of(t, false));
  carried_.erase(key_of(t, true));
  carried_.erase(key_of(t, false));
}

int64_t StatsMemo::carry(pybind11::list entries, int64_t tag) {
  if (tag != carried_tag_) carried_.clear();
  carried_tag_ = tag;
  carry_on_ = false;
  const Py_ssize_t n = PyList_GET_SIZE(entries.ptr());
  int64_t kept = 0;
  for (const auto& kv : map_) {
    const MemoEntry& e = kv.second;
    if (e.index < 0 || e.index >= n || e.version < 0 || e.tensor.expired()) continue;
    PyObject* value = PyList_GET_ITEM(entries.ptr(), e.index);     // borrowed
    if (!PyTuple_Check(value) || PyTuple_GET_SIZE(value) != opdump::contract::kFusedFields) continue;
    carried_.insert_or_assign(kv.first, CarriedEntry{e.tensor, e.version,
                                                     pybind11::reinterpret_borrow<pybind11::object>(value)});
    ++kept;
  }
  return kept;
}

void StatsMemo::enter(int64_t tag) {
  if (tag != carried_tag_) {
    carried_.clear();
    carried_tag_ = tag;
  }
  carry_on_ = true;
}

void StatsMemo::drop_carried() {
  carried_.clear();
  carried_tag_ = -1;
  carry_on_ = false;
}

// The operator that wrote `t` (just read as its output) has returned: the entry takes
// the version it now has if it moved by at most one (see DeviceStatsBatch.settle).
void StatsMemo::settle(const at::Tensor& t) {
  if (!handled(t)) return;
  auto it = map_.find(key_of(t, t.is_non_overlapping_and_dense()));
  if (it == map_.end()) return;
  MemoEntry& e = it->second;
  const int64_t now = version_of(t);
  if (e.version >= 0 && e.version <= now && now <= e.version + 1 && !e.tensor.expired()) e.version = now;
}

}  // namespace opdump

void register_stats_memo(pybind11::module& m) {
  using opdump::StatsMemo;
  pybind11::class_<StatsMemo>(m, "StatsMemo")
      .def(pybind11::init<bool>(), pybind11::arg("host") = false)
      .def_property_readonly("host", &StatsMemo::host, "reads with the host mode's float64 accumulation")
      .def("stats", &StatsMemo::stats,
           "(max, min, sum, sum of squares, numel) of a CPU tensor, remembered as entry `index`; the entry "
           "of a tensor reading the same memory; or None")
      .def_static("takes", &StatsMemo::takes, "whether stats() reads this tensor (else it gives None)")
      .def("forget", &StatsMemo::forget, "the tensor is being written: forget its memory")
      .def("settle", &StatsMemo::settle, "its writer returned: the entry takes its current version")
      .def("clear", &StatsMemo::clear, "forget this batch's entries (values carried for an iteration stay)")
      .def("carry", &StatsMemo::carry, pybind11::arg("entries"), pybind11::arg("tag"),
           "keep the values of this batch's entries (the batch's list) for later batches of iteration `tag`; "
           "how many")
      .def("enter", &StatsMemo::enter, pybind11::arg("tag"),
           "a batch of iteration `tag` starts: values carried for it are used, any other iteration's dropped")
      .def("drop_carried", &StatsMemo::drop_carried)
      .def_property_readonly("carried", &StatsMemo::carried, "values carried from earlier batches")
      .def("__len__", &StatsMemo::size)
      .def_property_readonly("reads", &StatsMemo::reads, "tensors read (not found), over the memo's life");
}
