// statistic.csv cells as text, in C++: the same characters as opdump/stats/formatting.py.
//
// Why: the writer formats three or more numbers per dumped tensor, thousands per
// step; in Python each float32 cell costs ~0.7 us (str(np.float32(v))) and the
// writer thread holds the GIL the training thread needs.  Here a cell costs
// ~0.1 us.
//
// Guarantees (tests/test_cell_text.py checks them against formatting.py, every
// float16 value, millions of float32/float64 bit patterns):
// * floats are written with the shortest decimal that round-trips in the
//   precision of the cell: std::to_chars (Ryu) for float32 and float64, a
//   search over 1..6 digits for float16 (the closest of the shortest);
// * notation: Python's repr for float64 (positional when the decimal exponent
//   is in [-4, 16)); numpy's str for float32 / float16 elements (positional when
//   1e-4 <= |x| < 1e6 / 1e3); "nan", "inf", "-inf"; a zero element is "0.0";
// * integers exactly (Python's str(int(v)) for anything else than a small int).
#include <torch/extension.h>

#include "contract.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// Codes shared with Python: contract.h (checked at load by opdump/stats/native.py).
using namespace opdump::contract;

// "d.ddd" digits (no dot) and the decimal exponent of the first digit.
struct Decimal {
  char digits[32];
  int ndigits = 0;
  int exp10 = 0;
};

// Parses std::to_chars' scientific output "d.ddde+XX" / "de-XX".
template <typename T>
Decimal shortest(T v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf - 1, v, std::chars_format::scientific);
  *r.ptr = '\0';
  Decimal d;
  const char* p = buf;
  for (; p < r.ptr && *p != 'e'; ++p) {
    if (*p >= '0' && *p <= '9') d.digits[d.ndigits++] = *p;
  }
  d.exp10 = std::atoi(p + 1);
  return d;
}

// float16: the closest among the shortest decimals that round-trip through _Float16.
// For each digit count, the correctly rounded decimal and its two neighbours are tried
// (at a power of two the round-trip interval is wider above than below).
Decimal shortest_half(double v) {
  const _Float16 h = static_cast<_Float16>(v);
  for (int prec = 1; prec <= 6; ++prec) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
    const char* e = std::strchr(buf, 'e');
    const int scale = std::atoi(e + 1) - (prec - 1);      // value = mantissa * 10**scale
    long long mant = 0;
    for (const char* p = buf; p < e; ++p)
      if (*p >= '0' && *p <= '9') mant = mant * 10 + (*p - '0');
    bool found = false;
    long long best = 0;
    double best_err = 0;
    for (long long m : {mant, mant - 1, mant + 1}) {
      if (m <= 0) continue;
      char cand[64];
      std::snprintf(cand, sizeof cand, "%llde%d", m, scale);
      const double back = std::strtod(cand, nullptr);
      if (static_cast<_Float16>(back) != h) continue;
      const double err = std::fabs(back - v);
      if (!found || err < best_err) { found = true; best = m; best_err = err; }
    }
    if (found) {
      Decimal d;
      auto r = std::to_chars(d.digits, d.digits + sizeof d.digits, best);
      d.ndigits = static_cast<int>(r.ptr - d.digits);
      d.exp10 = scale + d.ndigits - 1;
      return d;
    }
  }
  return shortest<double>(v);   // not reached for a finite float16
}

void trim_zeros(Decimal& d) {
  while (d.ndigits > 1 && d.digits[d.ndigits - 1] == '0') --d.ndigits;
}

void positional(std::string& out, bool negative, const Decimal& d) {
  if (negative) out += '-';
  if (d.exp10 < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-d.exp10 - 1), '0');
    out.append(d.digits, d.ndigits);
    return;
  }
  const int int_digits = d.exp10 + 1;
  if (d.ndigits <= int_digits) {
    out.append(d.digits, d.ndigits);
    out.append(static_cast<size_t>(int_digits - d.ndigits), '0');
    out += ".0";
  } else {
    out.append(d.digits, int_digits);
    out += '.';
    out.append(d.digits + int_digits, d.ndigits - int_digits);
  }
}

void scientific(std::string& out, bool negative, const Decimal& d) {
  if (negative) out += '-';
  out += d.digits[0];
  if (d.ndigits > 1) {
    out += '.';
    out.append(d.digits + 1, d.ndigits - 1);
  }
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", d.exp10 < 0 ? '-' : '+', std::abs(d.exp10));
  out += e;
}

bool special(std::string& out, double v) {
  if (std::isnan(v)) { out += "nan"; return true; }
  if (std::isinf(v)) { out += v > 0 ? "inf" : "-inf"; return true; }
  return false;
}

// Python's repr(float).
void repr_double(std::string& out, double v) {
  if (special(out, v)) return;
  if (v == 0) { out += std::signbit(v) ? "-0.0" : "0.0"; return; }
  Decimal d = shortest<double>(std::fabs(v));
  trim_zeros(d);
  if (d.exp10 >= -4 && d.exp10 < 16) positional(out, v < 0, d);
  else scientific(out, v < 0, d);
}

// numpy's str(np.float32(v)) / str(np.float16(v)); v is already a value of that type.
void numpy_str(std::string& out, double v, Precision p) {
  if (special(out, v)) return;
  if (v == 0) { out += std::signbit(v) ? "-0.0" : "0.0"; return; }   // e.g. a double below float16's range
  const double a = std::fabs(v);
  Decimal d = p == kHalf ? shortest_half(a) : shortest<float>(static_cast<float>(a));
  trim_zeros(d);
  const double upper = p == kHalf ? 1e3 : 1e6;
  if (a >= 1e-4 && a < upper) positional(out, v < 0, d);
  else scientific(out, v < 0, d);
}

// str(obj), as Python writes it.
void append_str(std::string& out, PyObject* obj) {
  PyObject* s = PyObject_Str(obj);
  if (!s) throw pybind11::error_already_set();
  Py_ssize_t len = 0;
  const char* c = PyUnicode_AsUTF8AndSize(s, &len);
  if (c) out.append(c, static_cast<size_t>(len));
  Py_DECREF(s);
  if (!c) throw pybind11::error_already_set();
}

void integer(std::string& out, PyObject* obj) {
  int overflow = 0;
  long long i = 0;
  if (PyLong_Check(obj)) {
    i = PyLong_AsLongLongAndOverflow(obj, &overflow);
  } else {
    overflow = 1;
  }
  if (!overflow) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, i);
    out.append(buf, r.ptr);
    return;
  }
  // anything else: str(int(obj)), exactly as Python does
  PyObject* as_int = PyNumber_Long(obj);
  if (!as_int) throw pybind11::error_already_set();
  append_str(out, as_int);
  Py_DECREF(as_int);
}

double as_double(PyObject* obj) {
  const double v = PyFloat_AsDouble(obj);
  if (v == -1.0 && PyErr_Occurred()) throw pybind11::error_already_set();
  return v;
}

// One cell: ``obj`` (None, int or float; str for text) of category ``kind``.
void cell(std::string& out, PyObject* obj, int kind, int precision) {
  if (obj == Py_None) return;
  switch (kind) {
    case kElement: {
      if (precision == kInteger) { integer(out, obj); return; }
      const double v = as_double(obj);
      if (v == 0) { out += "0.0"; return; }       // unsigned: see formatting.py
      if (precision == kDouble) { repr_double(out, v); return; }
      if (precision == kSingle) { numpy_str(out, static_cast<float>(v), kSingle); return; }
      numpy_str(out, static_cast<double>(static_cast<_Float16>(v)), kHalf);
      return;
    }
    case kComputed: repr_double(out, as_double(obj)); return;
    case kCount: integer(out, obj); return;
    default: append_str(out, obj);
  }
}

}  // namespace

// Per entry, its cells joined by ",".  An entry is a list of values in category order,
// or the CPU kernel's tuple (max, min, sum, sum of squares, numel), whose values the
// ``fused`` codes pick (avg = sum / numel, l2norm = sqrt(sum of squares), as device.py's _FUSED does).
std::vector<std::string> format_cells(const pybind11::list& entries, const std::vector<int>& precisions,
                                      const std::vector<int>& kinds, const std::vector<int>& fused) {
  const size_t n = static_cast<size_t>(PyList_GET_SIZE(entries.ptr()));
  if (precisions.size() != n) throw std::invalid_argument("format_cells: one precision per entry");
  if (fused.size() != kinds.size()) throw std::invalid_argument("format_cells: one fused code per category");
  std::vector<std::string> out(n);
  const size_t ncat = kinds.size();
  for (size_t i = 0; i < n; ++i) {
    PyObject* e = PyList_GET_ITEM(entries.ptr(), i);
    std::string& s = out[i];
    s.reserve(16 * ncat);
    const bool is_fused = PyTuple_Check(e);
    if (is_fused && PyTuple_GET_SIZE(e) != kFusedFields) throw std::invalid_argument("format_cells: a fused entry has 5 values");
    if (!is_fused && (!PyList_Check(e) || static_cast<size_t>(PyList_GET_SIZE(e)) != ncat))
      throw std::invalid_argument("format_cells: an entry is a list of one value per category");
    for (size_t c = 0; c < ncat; ++c) {
      if (c) s += ',';
      if (!is_fused) {
        cell(s, PyList_GET_ITEM(e, c), kinds[c], precisions[i]);
        continue;
      }
      PyObject* numel = PyTuple_GET_ITEM(e, kFieldNumel);
      switch (fused[c]) {
        case kCatMax: cell(s, PyTuple_GET_ITEM(e, kFieldMax), kinds[c], precisions[i]); break;
        case kCatMin: cell(s, PyTuple_GET_ITEM(e, kFieldMin), kinds[c], precisions[i]); break;
        case kCatAvg: repr_double(s, as_double(PyTuple_GET_ITEM(e, kFieldSum)) / as_double(numel)); break;
        case kCatL2: repr_double(s, std::sqrt(as_double(PyTuple_GET_ITEM(e, kFieldSumSq)))); break;
        case kCatCount: integer(s, numel); break;
        default: throw std::invalid_argument("format_cells: a category the CPU kernel does not give");
      }
    }
  }
  return out;
}
