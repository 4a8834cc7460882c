// The native statistics memo (stats_memo.cpp), declared for the other native parts that
// call it without going through Python (row_sink.cpp).
#pragma once

#include <torch/extension.h>

#include <unordered_map>
#include <vector>

namespace opdump {

struct MemoKey {
  uintptr_t ptr;
  int64_t numel;
  int dtype;
  std::vector<int64_t> geometry;   // empty when dense; sizes then strides when with gaps

  bool operator==(const MemoKey& o) const {
    return ptr == o.ptr && numel == o.numel && dtype == o.dtype && geometry == o.geometry;
  }
};

struct MemoKeyHash {
  size_t operator()(const MemoKey& k) const;
};

struct MemoEntry {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  int64_t version;
  int64_t index;
};

class StatsMemo {
 public:
  // host: read tensors with the host mode's float64 accumulation (cpu_kernel.cpp host_stats)
  explicit StatsMemo(bool host = false) : host_(host) {}
  bool host() const { return host_; }
  // (max, min, sum, sum of squares, numel) of `t`, remembered as entry `index`; the entry
  // (an int) of a tensor reading the same memory; or None (see stats_memo.cpp).
  pybind11::object stats(const at::Tensor& t, int64_t index);
  // Whether stats() reads `t` (it gives None exactly when this is false).
  static bool takes(const at::Tensor& t);
  void forget(const at::Tensor& t);
  void settle(const at::Tensor& t);
  void clear() { map_.clear(); }
  size_t size() const { return map_.size(); }
  int64_t reads() const { return reads_; }

 private:
  std::unordered_map<MemoKey, MemoEntry, MemoKeyHash> map_;
  int64_t reads_ = 0;
  bool host_ = false;   // tensors read (not found), over the memo's life
};

}  // namespace opdump
