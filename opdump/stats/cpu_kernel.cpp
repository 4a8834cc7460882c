// One pass over a CPU tensor's memory: max, min, sum and sum of squares.
//
// Why: torch needs three reductions for opdump's default statistics on CPU
// (aminmax, a float32 row norm, a float64 combine), and its aminmax is about
// 2x slower than a plain sum; this loop reads every element once, in memory
// order, and does all four in SIMD lanes (gcc vectorises the lane loop).
//
// Guarantees (tested against numpy in tests/test_stats_device.py and tests/test_stats_memo.py):
// * max/min are elements of the tensor, exact; NaN if any element is NaN;
// * sum/sumsq of tensors below 16384 elements accumulate in float64; larger
//   ones in float32 lanes over blocks of 1024 elements and in float64 across
//   blocks (relative error ~1e-8 typically, < 1e-5 worst case for
//   well-conditioned data), as torch's float32 rows did before; IEEE
//   propagation of NaN and Inf;
// * deterministic: the tensor is cut into fixed chunks whatever the thread
//   count, and the chunks are combined in order;
// * the GIL is released while reading, so writer threads keep running;
// * integer and bool tensors (bool read as its 0/1 bytes; not uint64): max/min
//   exact, as int64; sums in float64 (exact while below 2**53), taken from integer lanes
//   when that is provably the same value (reduce_int_fast);
// * a tensor it does not handle (not CPU, empty, overlapping or with gaps,
//   a negative-bit view, float64, complex, uint64…) gives None: the caller uses torch.
//
// `host_stats` is the same pass with the host mode's accumulation (stat_calc_mode "host",
// opdump/stats/host.py, whose numpy path is its exact twin): every sum in float64, each of
// kLanes lanes sequential over the elements i ≡ lane (mod kLanes) of a chunk of kChunk
// elements, the lanes added in order, then the chunk's tail in order, then the chunks in
// order (contract.h kHostLanes / kHostChunk).  Same result bit for bit whatever the thread
// count; the module is compiled with -ffp-contract=off so no multiply-add is fused.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "contract.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kBlock = 1024;      // float32 partial sums go to float64 every block
constexpr int64_t kChunk = 1 << 16;   // elements per parallel task (and per combine step)
constexpr int64_t kSmall = 1 << 14;
static_assert(kLanes == opdump::contract::kHostLanes && kChunk == opdump::contract::kHostChunk,
              "the host mode's order is the contract's (opdump/stats/host.py reproduces it)");   // below: sums in float64 lanes (the cost is the call, not the loop)

struct Acc {
  float max = -std::numeric_limits<float>::infinity();
  float min = std::numeric_limits<float>::infinity();
  double sum = 0.0;
  double sumsq = 0.0;
  bool nan = false;
};

// S: the lanes' accumulation type for sums (float, or double for small tensors).
//
// The additions are fixed (tests/test_stats_kernel_order.py rebuilds them in numpy): per block
// of kBlock elements, lane j sums the elements i ≡ j (mod kLanes) in order, from zero, in S;
// the block's lane sums go to float64 lane totals block by block, in order; the lanes' totals
// are added in lane order, then the tail (n mod kLanes elements) in order.  Two blocks are read
// side by side: their lane sums are independent chains, so the loop is not bound by the latency
// of one chain of additions (~1.6x on data in L2), with the very same additions.  max/min keep the
// first of equal values (+0 / -0) as a sequential scan does: each block's are folded from -inf,
// then into the running ones block by block (the same result).  NaN: any NaN element makes its
// lane's sum NaN (an addition never loses a NaN), so only a NaN sum or sum of squares (a NaN,
// or +Inf and -Inf) is scanned again for NaN elements.
template <typename T, typename S>
Acc reduce_range(const T* p, int64_t n) {
  float mx[kLanes], mn[kLanes];
  double sd[kLanes], qd[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    mx[j] = -std::numeric_limits<float>::infinity();
    mn[j] = std::numeric_limits<float>::infinity();
    sd[j] = qd[j] = 0.0;
  }
  const int64_t full = n - n % kLanes;
  int64_t b = 0;
  for (; b + 2 * kBlock <= full; b += 2 * kBlock) {       // two whole blocks side by side
    const T* pa = p + b;
    const T* pb = p + b + kBlock;
    float mxa[kLanes], mna[kLanes], mxb[kLanes], mnb[kLanes];
    S sa[kLanes], qa[kLanes], sb[kLanes], qb[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      mxa[j] = mxb[j] = -std::numeric_limits<float>::infinity();
      mna[j] = mnb[j] = std::numeric_limits<float>::infinity();
      sa[j] = qa[j] = sb[j] = qb[j] = S(0);
    }
    for (int64_t i = 0; i < kBlock; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float v = static_cast<float>(pa[i + j]);
        const float w = static_cast<float>(pb[i + j]);
        mxa[j] = mxa[j] < v ? v : mxa[j];   // a NaN never wins a comparison (see above)
        mna[j] = v < mna[j] ? v : mna[j];
        mxb[j] = mxb[j] < w ? w : mxb[j];
        mnb[j] = w < mnb[j] ? w : mnb[j];
        sa[j] += S(v);
        qa[j] += S(v) * S(v);
        sb[j] += S(w);
        qb[j] += S(w) * S(w);
      }
    }
    for (int j = 0; j < kLanes; ++j) {
      mx[j] = mx[j] < mxa[j] ? mxa[j] : mx[j];
      mn[j] = mna[j] < mn[j] ? mna[j] : mn[j];
      mx[j] = mx[j] < mxb[j] ? mxb[j] : mx[j];
      mn[j] = mnb[j] < mn[j] ? mnb[j] : mn[j];
      sd[j] += sa[j];
      qd[j] += qa[j];
      sd[j] += sb[j];
      qd[j] += qb[j];
    }
  }
  for (; b < full; b += kBlock) {                          // the last block (or part of one)
    const int64_t end = std::min(full, b + kBlock);
    S s[kLanes], q[kLanes];
    for (int j = 0; j < kLanes; ++j) s[j] = q[j] = S(0);
    for (int64_t i = b; i < end; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float v = static_cast<float>(p[i + j]);
        mx[j] = mx[j] < v ? v : mx[j];
        mn[j] = v < mn[j] ? v : mn[j];
        s[j] += S(v);
        q[j] += S(v) * S(v);
      }
    }
    for (int j = 0; j < kLanes; ++j) {
      sd[j] += s[j];
      qd[j] += q[j];
    }
  }
  Acc a;
  for (int j = 0; j < kLanes; ++j) {
    a.max = a.max < mx[j] ? mx[j] : a.max;
    a.min = mn[j] < a.min ? mn[j] : a.min;
    a.sum += sd[j];
    a.sumsq += qd[j];
  }
  for (int64_t i = full; i < n; ++i) {
    const float v = static_cast<float>(p[i]);
    a.max = a.max < v ? v : a.max;
    a.min = v < a.min ? v : a.min;
    a.sum += v;
    a.sumsq += static_cast<double>(v) * v;
  }
  bool any_nan = false;
  if (a.sum != a.sum || a.sumsq != a.sumsq) {           // NaN in the sums: is an element NaN?
    for (int64_t i = 0; i < n && !any_nan; ++i) {
      const float v = static_cast<float>(p[i]);
      any_nan = v != v;
    }
  }
  a.nan = any_nan;
  return a;
}

Acc combine(Acc a, const Acc& b) {
  a.max = a.max < b.max ? b.max : a.max;
  a.min = b.min < a.min ? b.min : a.min;
  a.sum += b.sum;
  a.sumsq += b.sumsq;
  a.nan = a.nan || b.nan;
  return a;
}

// Fixed chunks of kChunk elements reduced in parallel, combined in order (deterministic).
template <typename A, typename T, typename Range, typename Combine>
A reduce_chunks(const T* p, int64_t n, Range range, Combine combine) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) return range(p, n);
  std::vector<A> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      parts[c] = range(p + c * kChunk, std::min(kChunk, n - c * kChunk));
    }
  });
  A a = parts[0];
  for (int64_t c = 1; c < chunks; ++c) a = combine(a, parts[c]);
  return a;
}

// The host mode's order (see the header): float64 lanes, sequential, no blocks.
template <typename T>
Acc reduce_range_host(const T* p, int64_t n) {
  float mx[kLanes], mn[kLanes];
  double s[kLanes], q[kLanes];
  int nan[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    mx[j] = -std::numeric_limits<float>::infinity();
    mn[j] = std::numeric_limits<float>::infinity();
    s[j] = q[j] = 0.0;
    nan[j] = 0;
  }
  const int64_t full = n - n % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = static_cast<float>(p[i + j]);
      mx[j] = mx[j] < v ? v : mx[j];
      mn[j] = v < mn[j] ? v : mn[j];
      const double d = static_cast<double>(v);
      s[j] += d;
      q[j] += d * d;
      nan[j] |= (v != v);
    }
  }
  Acc a;
  int any_nan = 0;
  for (int j = 0; j < kLanes; ++j) {
    a.max = a.max < mx[j] ? mx[j] : a.max;
    a.min = mn[j] < a.min ? mn[j] : a.min;
    a.sum += s[j];
    a.sumsq += q[j];
    any_nan |= nan[j];
  }
  for (int64_t i = full; i < n; ++i) {
    const float v = static_cast<float>(p[i]);
    a.max = a.max < v ? v : a.max;
    a.min = v < a.min ? v : a.min;
    const double d = static_cast<double>(v);
    a.sum += d;
    a.sumsq += d * d;
    any_nan |= (v != v);
  }
  a.nan = any_nan != 0;
  return a;
}

template <typename T>
Acc reduce_all_host(const T* p, int64_t n) {
  return reduce_chunks<Acc>(p, n, reduce_range_host<T>, combine);
}

template <typename T>
Acc reduce_all(const T* p, int64_t n) {
  if (n < kSmall) return reduce_range<T, double>(p, n);
  return reduce_chunks<Acc>(p, n, reduce_range<T, float>, combine);
}

// Integer and bool tensors: max/min exact in int64, sums in float64 lanes (exact up to 2**53).
struct IntAcc {
  int64_t max = std::numeric_limits<int64_t>::min();
  int64_t min = std::numeric_limits<int64_t>::max();
  double sum = 0.0;
  double sumsq = 0.0;
};

template <typename T>
IntAcc reduce_int_range(const T* p, int64_t n) {
  T mx[kLanes], mn[kLanes];
  double s[kLanes], q[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    mx[j] = std::numeric_limits<T>::lowest();
    mn[j] = std::numeric_limits<T>::max();
    s[j] = q[j] = 0.0;
  }
  const int64_t full = n - n % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const T v = p[i + j];
      mx[j] = mx[j] < v ? v : mx[j];
      mn[j] = v < mn[j] ? v : mn[j];
      const double d = static_cast<double>(v);
      s[j] += d;
      q[j] += d * d;
    }
  }
  IntAcc a;
  for (int j = 0; j < kLanes && full > 0; ++j) {
    a.max = std::max<int64_t>(a.max, mx[j]);
    a.min = std::min<int64_t>(a.min, mn[j]);
    a.sum += s[j];
    a.sumsq += q[j];
  }
  for (int64_t i = full; i < n; ++i) {
    const T v = p[i];
    a.max = std::max<int64_t>(a.max, v);
    a.min = std::min<int64_t>(a.min, v);
    const double d = static_cast<double>(v);
    a.sum += d;
    a.sumsq += d * d;
  }
  return a;
}

IntAcc combine_int(IntAcc a, const IntAcc& b) {
  a.max = std::max(a.max, b.max);
  a.min = std::min(a.min, b.min);
  a.sum += b.sum;
  a.sumsq += b.sumsq;
  return a;
}

template <typename T>
IntAcc reduce_int_all(const T* p, int64_t n) {
  return reduce_chunks<IntAcc>(p, n, reduce_int_range<T>, combine_int);
}

// The same values from integer lanes, when they are exact (~5x faster: the float64 lanes above
// convert every element, which does not vectorise for int64).  Why it is the same result bit
// for bit: with M = max |v| and n elements, n*M <= 2**53 and n*M*M <= 2**53 bound every partial
// sum of the float64 loop (any order, any lane, any chunk) by 2**53, so each of its additions is
// exact and it gives the exact integer sums, which these integer lanes compute (modulo 2**64,
// exact under the same bound) and convert once.  Outside the bound: the float64 loop.
struct ExactAcc {
  int64_t max = std::numeric_limits<int64_t>::min();
  int64_t min = std::numeric_limits<int64_t>::max();
  uint64_t sum = 0;      // modulo 2**64
  uint64_t sumsq = 0;
};

template <typename T>
ExactAcc exact_int_range(const T* p, int64_t n) {
  int64_t mx[kLanes], mn[kLanes];
  uint64_t s[kLanes], q[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    mx[j] = std::numeric_limits<int64_t>::min();
    mn[j] = std::numeric_limits<int64_t>::max();
    s[j] = q[j] = 0;
  }
  const int64_t full = n - n % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const int64_t v = static_cast<int64_t>(p[i + j]);
      mx[j] = mx[j] < v ? v : mx[j];
      mn[j] = v < mn[j] ? v : mn[j];
      s[j] += static_cast<uint64_t>(v);
      q[j] += static_cast<uint64_t>(v) * static_cast<uint64_t>(v);
    }
  }
  ExactAcc a;
  for (int j = 0; j < kLanes; ++j) {
    a.max = std::max(a.max, mx[j]);
    a.min = std::min(a.min, mn[j]);
    a.sum += s[j];
    a.sumsq += q[j];
  }
  for (int64_t i = full; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(p[i]);
    a.max = std::max(a.max, v);
    a.min = std::min(a.min, v);
    a.sum += static_cast<uint64_t>(v);
    a.sumsq += static_cast<uint64_t>(v) * static_cast<uint64_t>(v);
  }
  return a;
}

ExactAcc combine_exact(ExactAcc a, const ExactAcc& b) {
  a.max = std::max(a.max, b.max);
  a.min = std::min(a.min, b.min);
  a.sum += b.sum;
  a.sumsq += b.sumsq;
  return a;
}

// Whether integer lanes give reduce_int_all's values for these extremes and count (see above).
bool sums_exact(int64_t max, int64_t min, int64_t n) {
  constexpr uint64_t kExact = uint64_t(1) << 53;
  if (min == std::numeric_limits<int64_t>::min()) return false;
  const uint64_t m = static_cast<uint64_t>(std::max(max < 0 ? -max : max, min < 0 ? -min : min));
  if (m > kExact) return false;
  const unsigned __int128 nm = static_cast<unsigned __int128>(m) * static_cast<uint64_t>(n);
  return nm <= kExact && nm * m <= kExact;
}

template <typename T>
IntAcc reduce_int_fast(const T* p, int64_t n) {
  const ExactAcc e = reduce_chunks<ExactAcc>(p, n, exact_int_range<T>, combine_exact);
  if (!sums_exact(e.max, e.min, n)) return reduce_int_all(p, n);
  IntAcc a;
  a.max = e.max;
  a.min = e.min;
  a.sum = static_cast<double>(static_cast<int64_t>(e.sum));
  a.sumsq = static_cast<double>(e.sumsq);
  return a;
}

pybind11::object int_stats(const at::Tensor& x, const void* data, int64_t n) {
  IntAcc a;
  {
    pybind11::gil_scoped_release no_gil;
    switch (x.scalar_type()) {
      case at::kBool:  // stored as one byte 0/1
      case at::kByte: a = reduce_int_fast(static_cast<const uint8_t*>(data), n); break;
      case at::kChar: a = reduce_int_fast(static_cast<const int8_t*>(data), n); break;
      case at::kShort: a = reduce_int_fast(static_cast<const int16_t*>(data), n); break;
      case at::kInt: a = reduce_int_fast(static_cast<const int32_t*>(data), n); break;
      case at::kUInt16: a = reduce_int_fast(static_cast<const uint16_t*>(data), n); break;
      case at::kUInt32: a = reduce_int_fast(static_cast<const uint32_t*>(data), n); break;
      default: a = reduce_int_fast(static_cast<const int64_t*>(data), n); break;
    }
  }
  return pybind11::make_tuple(a.max, a.min, a.sum, a.sumsq);
}

}  // namespace

// (max, min, sum, sum of squares) — contract.h's first four fused fields: Python floats for
// float tensors, max/min as Python ints for integer and bool tensors; or None (see the
// header).  Exported by native_module.cpp; also used by stats_memo.cpp.
namespace {

pybind11::object one_pass(const at::Tensor& x, bool host) {
  if (!x.defined() || !x.device().is_cpu() || x.layout() != at::kStrided || x.numel() == 0 ||
      x.is_neg() || x.is_conj() || !x.is_non_overlapping_and_dense()) {
    return pybind11::none();
  }
  const auto dtype = x.scalar_type();
  // Dense without overlap and with non-negative strides: the elements are exactly
  // the numel() consecutive ones starting at data_ptr(), in some order.
  const int64_t n = x.numel();
  const void* data = x.data_ptr();
  switch (dtype) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt:
    case at::kLong: case at::kUInt16: case at::kUInt32:
      return int_stats(x, data, n);
    case at::kFloat: case at::kBFloat16: case at::kHalf:
      break;
    default:
      return pybind11::none();
  }
  Acc a;
  {
    pybind11::gil_scoped_release no_gil;
    switch (dtype) {
      case at::kFloat:
        a = host ? reduce_all_host(static_cast<const float*>(data), n) : reduce_all(static_cast<const float*>(data), n);
        break;
      case at::kBFloat16:
        a = host ? reduce_all_host(static_cast<const c10::BFloat16*>(data), n)
                 : reduce_all(static_cast<const c10::BFloat16*>(data), n);
        break;
      default:
        a = host ? reduce_all_host(static_cast<const c10::Half*>(data), n)
                 : reduce_all(static_cast<const c10::Half*>(data), n);
        break;
    }
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return pybind11::make_tuple(a.nan ? nan : static_cast<double>(a.max),
                              a.nan ? nan : static_cast<double>(a.min), a.sum, a.sumsq);
}

}  // namespace

pybind11::object fused_stats(const at::Tensor& x) { return one_pass(x, false); }

// The same fields with the host mode's float64 accumulation (see the header); integer and bool
// tensors already accumulate that way.  Exported by native_module.cpp; used by stats_memo.cpp.
pybind11::object host_stats(const at::Tensor& x) { return one_pass(x, true); }
