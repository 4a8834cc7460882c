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

// The values of a tensor read in an earlier batch of the same iteration (see StatsMemo::carry).
struct CarriedEntry {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  int64_t version;
  pybind11::object value;          // the fused tuple (contract.h FusedField), immutable
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
  // Keep the values of this batch's entries (`entries`: the batch's list, indexed as the
  // map's entries) for the later batches of iteration `tag`; lookups stop using them until
  // enter(tag).  Returns how many were kept.
  int64_t carry(pybind11::list entries, int64_t tag);
  // A batch of iteration `tag` starts taking tensors: values carried for `tag` are used
  // again, those of any other iteration dropped.
  void enter(int64_t tag);
  // Lookups stop using carried values (kept) until the next enter.
  void leave() { carry_on_ = false; }
  void drop_carried();
  size_t carried() const { return carried_.size(); }

 private:
  std::unordered_map<MemoKey, MemoEntry, MemoKeyHash> map_;
  std::unordered_map<MemoKey, CarriedEntry, MemoKeyHash> carried_;
  int64_t carried_tag_ = -1;    // the iteration carried_ belongs to
  bool carry_on_ = false;       // entered for carried_tag_: lookups may use carried_
  int64_t reads_ = 0;           // tensors read (not found), over the memo's life
  bool host_ = false;
};

}  // namespace opdump
