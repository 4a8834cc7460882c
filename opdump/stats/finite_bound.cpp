// The overflow watch's reading of a CPU tensor (op_debug_mode 3; README "Debug dumps"):
// is every element finite, and how large is the largest magnitude?
//
// Why: the watch reads every floating tensor an operator makes.  It needs only the NaN/Inf
// facts and, to prove later operators finite without reading their outputs
// (opdump/debug/overflow_bounds.py), a bound on the magnitudes.  Both come from one integer
// maximum over the elements' bits with the sign cleared: IEEE magnitudes order like their
// bit patterns, every NaN pattern is above the Inf pattern, Inf above every finite one.  No
// float arithmetic, no min/max/sum pair as fused_stats does (cpu_kernel.cpp), no dispatcher
// call and no 0-d result tensor as torch.isfinite(t).all() or t.sum() need.
//
// Guarantees: finite_bound(x) is (value, signed): value is exact: NaN when an element is NaN,
// +inf when an element is ±Inf and none is NaN, else max |x| (an element's magnitude, exact);
// signed is true when some element has its sign bit set (-0.0 too), false when every
// element is >= +0 (a second integer maximum, over the raw bits, in the same pass).  float32, float64,
// float16 and bfloat16 tensors on the CPU with elements that are non-overlapping and dense
// (any strides, a negative-bit view too: magnitudes do not see the sign); anything else
// gives None (the caller reads it with torch).  Order-independent, so the parallel split
// changes nothing; the GIL is released for large tensors.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

namespace {

constexpr int64_t kGrain = 1 << 16;            // elements per parallel task
constexpr int64_t kReleaseGil = 1 << 15;      // below: the call costs more than the loop

template <typename U>
struct Max {
  U magnitude = 0;   // max of the bits with the sign cleared
  U raw = 0;         // max of the raw bits: >= the sign bit when an element is signed
};

template <typename U>
Max<U> max_bits(const U* p, int64_t n, U mask) {
  constexpr int kLanes = 64 / sizeof(U);       // one cache line of lanes (vectorised by gcc)
  U lane[kLanes] = {}, raw[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      lane[k] = std::max<U>(lane[k], p[i + k] & mask);
      raw[k] = std::max<U>(raw[k], p[i + k]);
    }
  Max<U> m;
  for (int k = 0; k < kLanes; ++k) {
    m.magnitude = std::max(m.magnitude, lane[k]);
    m.raw = std::max(m.raw, raw[k]);
  }
  for (; i < n; ++i) {
    m.magnitude = std::max<U>(m.magnitude, p[i] & mask);
    m.raw = std::max<U>(m.raw, p[i]);
  }
  return m;
}

template <typename U>
Max<U> reduce(const U* p, int64_t n, U mask) {
  if (n < 2 * kGrain) return max_bits(p, n, mask);
  Max<U> m;
  std::mutex lock;
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    Max<U> part = max_bits(p + b, e - b, mask);
    std::lock_guard<std::mutex> g(lock);
    m.magnitude = std::max(m.magnitude, part.magnitude);
    m.raw = std::max(m.raw, part.raw);
  });
  return m;
}

// max |x| from the largest magnitude pattern `m` (`inf`: the Inf pattern)
template <typename U>
double value_of(U m, U inf, double magnitude) {
  if (m > inf) return std::numeric_limits<double>::quiet_NaN();
  if (m == inf) return std::numeric_limits<double>::infinity();
  return magnitude;
}

}  // namespace

pybind11::object finite_bound(const at::Tensor& x) {
  if (!x.device().is_cpu() || x.layout() != at::kStrided || x.numel() == 0 || !x.is_non_overlapping_and_dense())
    return pybind11::none();
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16)
    return pybind11::none();
  const int64_t n = x.numel();
  const void* data = x.data_ptr();
  double out = 0.0;
  bool is_signed = false;
  auto run = [&]() {
    if (dtype == at::kFloat) {
      auto m = reduce(static_cast<const uint32_t*>(data), n, uint32_t(0x7fffffffu));
      float f;
      std::memcpy(&f, &m.magnitude, sizeof f);
      out = value_of<uint32_t>(m.magnitude, 0x7f800000u, f);
      is_signed = m.raw > 0x7fffffffu;
    } else if (dtype == at::kDouble) {
      auto m = reduce(static_cast<const uint64_t*>(data), n, uint64_t(0x7fffffffffffffffull));
      double d;
      std::memcpy(&d, &m.magnitude, sizeof d);
      out = value_of<uint64_t>(m.magnitude, 0x7ff0000000000000ull, d);
      is_signed = m.raw > 0x7fffffffffffffffull;
    } else {
      auto m = reduce(static_cast<const uint16_t*>(data), n, uint16_t(0x7fff));
      // the magnitude as float32: float16 and bfloat16 widen exactly
      float f = dtype == at::kHalf ? static_cast<float>(c10::Half(m.magnitude, c10::Half::from_bits()))
                                   : static_cast<float>(c10::BFloat16(m.magnitude, c10::BFloat16::from_bits()));
      out = value_of<uint16_t>(m.magnitude, dtype == at::kHalf ? uint16_t(0x7c00) : uint16_t(0x7f80), f);
      is_signed = m.raw > 0x7fff;
    }
  };
  if (n >= kReleaseGil) {
    pybind11::gil_scoped_release nogil;
    run();
  } else {
    run();
  }
  return pybind11::make_tuple(out, is_signed);
}
