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
// gives None (the caller reads it with torch).  The GIL is released for large tensors, which
// are read in parallel chunks (max_bits).
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>

namespace {

constexpr int64_t kReleaseGil = 1 << 15;      // below: the call costs more than the loop

// One pass, one cache line of lanes per step (gcc vectorises the lane loop): the maximum of
// the bits with the sign cleared (the magnitude) and of the raw bits (>= the sign bit when
// an element is signed).  A plain loop with constant masks reads at memory speed on one
// thread (a mask passed as an argument read at half that, measured on the CPU reading).
template <typename U, U kMask>
void max_bits_serial(const U* p, int64_t n, U& magnitude, U& raw_max) {
  constexpr int kLanes = 64 / sizeof(U);
  U lane[kLanes] = {}, raw[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const U v = p[i + k];
      lane[k] = std::max<U>(lane[k], v & kMask);
      raw[k] = std::max<U>(raw[k], v);
    }
  U m = 0, r = 0;
  for (int k = 0; k < kLanes; ++k) {
    m = std::max(m, lane[k]);
    r = std::max(r, raw[k]);
  }
  for (; i < n; ++i) {
    m = std::max<U>(m, p[i] & kMask);
    r = std::max<U>(r, p[i]);
  }
  magnitude = m;
  raw_max = r;
}

// Large tensors: fixed chunks of kChunkBytes read by the intra-op pool (at::parallel_for, as
// cpu_kernel.cpp's statistics), each with the serial loop above, their maxima combined.  Why:
// the watch reads on the training thread after an operator, while the step's own compute uses
// every intra-op thread; one thread alone reading a large output makes the watched step's
// wall time longer by the whole read (bench/watch_threads.py, issue 20's wall-vs-CPU gap).
// Same result bit for bit: a maximum does not depend on the order its parts are combined in.
constexpr int64_t kChunkBytes = int64_t(1) << 20;

template <typename U, U kMask>
void max_bits(const U* p, int64_t n, U& magnitude, U& raw_max) {
  const int64_t chunk = kChunkBytes / static_cast<int64_t>(sizeof(U));
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks < 2 || at::get_num_threads() < 2 || at::in_parallel_region()) {
    max_bits_serial<U, kMask>(p, n, magnitude, raw_max);
    return;
  }
  std::vector<U> mags(static_cast<size_t>(chunks)), raws(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      max_bits_serial<U, kMask>(p + c * chunk, std::min(chunk, n - c * chunk), mags[c], raws[c]);
  });
  magnitude = *std::max_element(mags.begin(), mags.end());
  raw_max = *std::max_element(raws.begin(), raws.end());
}

// max |x| from the largest magnitude pattern `m` (`inf`: the Inf pattern)
template <typename U>
double value_of(U m, U inf, double magnitude) {
  if (m > inf) return std::numeric_limits<double>::quiet_NaN();
  if (m == inf) return std::numeric_limits<double>::infinity();
  return magnitude;
}

}  // namespace

namespace opdump {

// the reading itself (no Python): false for a tensor it does not handle; `nogil`: release the
// GIL for a large tensor (the caller holds it).  The native eager observer's overflow watch
// (opdump/capture/eager/native/watch.cpp) calls it without the GIL.
bool finite_read(const at::Tensor& x, double* value, bool* signed_out, bool nogil) {
  if (!x.device().is_cpu() || x.layout() != at::kStrided || x.numel() == 0 || !x.is_non_overlapping_and_dense())
    return false;
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16)
    return false;
  const int64_t n = x.numel();
  const void* data = x.data_ptr();
  double out = 0.0;
  bool is_signed = false;
  auto run = [&]() {
    if (dtype == at::kFloat) {
      uint32_t m, r;
      max_bits<uint32_t, 0x7fffffffu>(static_cast<const uint32_t*>(data), n, m, r);
      float f;
      std::memcpy(&f, &m, sizeof f);
      out = value_of<uint32_t>(m, 0x7f800000u, f);
      is_signed = r > 0x7fffffffu;
    } else if (dtype == at::kDouble) {
      uint64_t m, r;
      max_bits<uint64_t, 0x7fffffffffffffffull>(static_cast<const uint64_t*>(data), n, m, r);
      double d;
      std::memcpy(&d, &m, sizeof d);
      out = value_of<uint64_t>(m, 0x7ff0000000000000ull, d);
      is_signed = r > 0x7fffffffffffffffull;
    } else {
      uint16_t m, r;
      max_bits<uint16_t, uint16_t(0x7fff)>(static_cast<const uint16_t*>(data), n, m, r);
      // the magnitude as float32: float16 and bfloat16 widen exactly
      float f = dtype == at::kHalf ? static_cast<float>(c10::Half(m, c10::Half::from_bits()))
                                   : static_cast<float>(c10::BFloat16(m, c10::BFloat16::from_bits()));
      out = value_of<uint16_t>(m, dtype == at::kHalf ? uint16_t(0x7c00) : uint16_t(0x7f80), f);
      is_signed = r > 0x7fff;
    }
  };
  if (nogil && n >= kReleaseGil) {
    pybind11::gil_scoped_release release;
    run();
  } else {
    run();
  }
  *value = out;
  *signed_out = is_signed;
  return true;
}

}  // namespace opdump

pybind11::object finite_bound(const at::Tensor& x) {
  double out = 0.0;
  bool is_signed = false;
  if (!opdump::finite_read(x, &out, &is_signed, true)) return pybind11::none();
  return pybind11::make_tuple(out, is_signed);
}
