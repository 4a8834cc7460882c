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
#include "row_batch.h"

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

double as_double(PyObject* obj) {
  const double v = PyFloat_AsDouble(obj);
  if (v == -1.0 && PyErr_Occurred()) throw pybind11::error_already_set();
  return v;
}

// One cell's value, read from its Python object with the GIL held (read_cell), written as
// text without it (put_cell): the writer thread formats thousands of numbers per step and
// holds the GIL the training thread needs only while reading them.
struct CellValue {
  enum Tag : uint8_t { kNone, kElem, kRepr, kInt, kStr } tag = kNone;
  int precision = 0;            // kElem: how the element is written (Precision)
  double d = 0;
  long long i = 0;
  std::string text;             // kStr: str(obj) (a text cell, an int beyond 64 bits)
};

void read_int(CellValue& v, PyObject* obj) {
  int overflow = 0;
  if (PyLong_Check(obj)) {
    v.i = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (!overflow) { v.tag = CellValue::kInt; return; }
  }
  // anything else: str(int(obj)), exactly as Python does
  PyObject* as_int = PyNumber_Long(obj);
  if (!as_int) throw pybind11::error_already_set();
  v.tag = CellValue::kStr;
  try {
    append_str(v.text, as_int);
  } catch (...) {
    Py_DECREF(as_int);
    throw;
  }
  Py_DECREF(as_int);
}

// ``obj`` (None, int or float; str for text) of category ``kind``.
void read_cell(CellValue& v, PyObject* obj, int kind, int precision) {
  if (obj == Py_None) { v.tag = CellValue::kNone; return; }
  switch (kind) {
    case kElement:
      if (precision == kInteger) { read_int(v, obj); return; }
      v.tag = CellValue::kElem;
      v.precision = precision;
      v.d = as_double(obj);
      return;
    case kComputed: v.tag = CellValue::kRepr; v.d = as_double(obj); return;
    case kCount: read_int(v, obj); return;
    default: v.tag = CellValue::kStr; append_str(v.text, obj);
  }
}

// The text of a value read by read_cell (no Python object is touched: runs without the GIL).
void put_cell(std::string& out, const CellValue& v) {
  switch (v.tag) {
    case CellValue::kNone: return;
    case CellValue::kElem: {
      if (v.d == 0) { out += "0.0"; return; }       // unsigned: see formatting.py
      if (v.precision == kDouble) { repr_double(out, v.d); return; }
      if (v.precision == kSingle) { numpy_str(out, static_cast<float>(v.d), kSingle); return; }
      numpy_str(out, static_cast<double>(static_cast<_Float16>(v.d)), kHalf);
      return;
    }
    case CellValue::kRepr: repr_double(out, v.d); return;
    case CellValue::kInt: {
      char buf[32];
      auto r = std::to_chars(buf, buf + sizeof buf, v.i);
      out.append(buf, r.ptr);
      return;
    }
    case CellValue::kStr: out += v.text; return;
  }
}

}  // namespace

// Per entry, its cells joined by ",".  An entry is a list of values in category order,
// or the CPU kernel's tuple (max, min, sum, sum of squares, numel), whose values the
// ``fused`` codes pick (avg = sum / numel, l2norm = sqrt(sum of squares), as device.py's _FUSED does).
// The values are read with the GIL held, the text is written with it released.
std::vector<std::string> format_cells(const pybind11::list& entries, const std::vector<int>& precisions,
                                      const std::vector<int>& kinds, const std::vector<int>& fused) {
  const size_t n = static_cast<size_t>(PyList_GET_SIZE(entries.ptr()));
  if (precisions.size() != n) throw std::invalid_argument("format_cells: one precision per entry");
  if (fused.size() != kinds.size()) throw std::invalid_argument("format_cells: one fused code per category");
  const size_t ncat = kinds.size();
  std::vector<CellValue> values(n * ncat);
  for (size_t i = 0; i < n; ++i) {
    PyObject* e = PyList_GET_ITEM(entries.ptr(), i);
    const bool is_fused = PyTuple_Check(e);
    if (is_fused && PyTuple_GET_SIZE(e) != kFusedFields) throw std::invalid_argument("format_cells: a fused entry has 5 values");
    if (!is_fused && (!PyList_Check(e) || static_cast<size_t>(PyList_GET_SIZE(e)) != ncat))
      throw std::invalid_argument("format_cells: an entry is a list of one value per category");
    for (size_t c = 0; c < ncat; ++c) {
      CellValue& v = values[i * ncat + c];
      if (!is_fused) {
        read_cell(v, PyList_GET_ITEM(e, c), kinds[c], precisions[i]);
        continue;
      }
      PyObject* numel = PyTuple_GET_ITEM(e, kFieldNumel);
      switch (fused[c]) {
        case kCatMax: read_cell(v, PyTuple_GET_ITEM(e, kFieldMax), kinds[c], precisions[i]); break;
        case kCatMin: read_cell(v, PyTuple_GET_ITEM(e, kFieldMin), kinds[c], precisions[i]); break;
        case kCatAvg:
          v.tag = CellValue::kRepr;
          v.d = as_double(PyTuple_GET_ITEM(e, kFieldSum)) / as_double(numel);
          break;
        case kCatL2:
          v.tag = CellValue::kRepr;
          v.d = std::sqrt(as_double(PyTuple_GET_ITEM(e, kFieldSumSq)));
          break;
        case kCatCount: read_int(v, numel); break;
        default: throw std::invalid_argument("format_cells: a category the CPU kernel does not give");
      }
    }
  }
  std::vector<std::string> out(n);
  {
    pybind11::gil_scoped_release unlocked;
    for (size_t i = 0; i < n; ++i) {
      std::string& s = out[i];
      s.reserve(16 * ncat);
      for (size_t c = 0; c < ncat; ++c) {
        if (c) s += ',';
        put_cell(s, values[i * ncat + c]);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// statistic.csv rows as text: a batch of queued rows (contract.h RowField tuples) and their
// statistic cells, written as the bytes opdump/recorder/rows.py's Python path writes.
//
// Why: that path costs ~5 us of Python per row in the writer thread, which holds the GIL the
// training thread needs; here a row costs well under a microsecond, most of it with the GIL
// released.
//
// Guarantees (tests/test_stats_csv.py, tests/test_graph_native_taps.py): the bytes equal the csv
// module's (opdump/write/statistic_csv.py encode_rows) for the same cells; a field is written
// only when its text is certain: an exact int (its decimal digits) or an exact str without a
// control character (minimal quoting: a field holding ',' or '"' is quoted, '"' doubled).
// Anything else (a control character, which the Python path escapes; another type; a handle
// out of range; text that is not valid UTF-8) gives None and the caller takes its Python path.
namespace {

struct Piece {
  enum Kind : uint8_t { kCsv, kInt, kRaw };
  const char* p = nullptr;
  Py_ssize_t n = 0;
  long long v = 0;
  Kind kind = kRaw;
};

struct Fallback {};

Piece text_piece(PyObject* o, Piece::Kind kind) {
  if (!PyUnicode_CheckExact(o)) throw Fallback();
  Piece pc;
  pc.kind = kind;
  pc.p = PyUnicode_AsUTF8AndSize(o, &pc.n);       // cached by the str: lives as long as it does
  if (!pc.p) { PyErr_Clear(); throw Fallback(); }
  return pc;
}

Piece int_piece(PyObject* o) {
  if (!PyLong_CheckExact(o)) throw Fallback();
  int overflow = 0;
  Piece pc;
  pc.kind = Piece::kInt;
  pc.v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow || (pc.v == -1 && PyErr_Occurred())) { PyErr_Clear(); throw Fallback(); }
  return pc;
}

// a cell str(obj) then quoted: an exact int or str
Piece field_piece(PyObject* o) {
  return PyLong_CheckExact(o) ? int_piece(o) : text_piece(o, Piece::kCsv);
}

// Per byte of UTF-8: 1 a quote or a comma (the field is quoted), 2 a control character or
// the lead byte of a possible one (C1 is C2 80..9F, U+2028/2029 are E2 80 A8/A9: looked at closely).
struct ByteClasses {
  unsigned char c[256] = {};
  constexpr ByteClasses() {
    for (int b = 0; b < 0x20; ++b) c[b] = 2;
    c[0x7f] = 2;
    c[0xC2] = 2;
    c[0xE2] = 2;
    c[static_cast<unsigned char>(',')] = 1;
    c[static_cast<unsigned char>('"')] = 1;
  }
};
constexpr ByteClasses kByteClasses;

// Writes the text at `w` (room: 2n + 2 bytes), quoted if needed; nullptr: the text holds a control
// character (C0, DEL, C1, U+2028, U+2029), which the Python path escapes.
char* put_csv(char* w, const char* c, Py_ssize_t n) {
  const unsigned char* u = reinterpret_cast<const unsigned char*>(c);
  unsigned char seen = 0;
  for (Py_ssize_t i = 0; i < n; ++i) seen |= kByteClasses.c[u[i]];
  if (seen & 2) {
    for (Py_ssize_t i = 0; i < n; ++i) {
      const unsigned char b = u[i];
      if (b < 0x20 || b == 0x7f) return nullptr;
      if (b == 0xC2 && i + 1 < n && u[i + 1] <= 0x9f) return nullptr;   // U+0080..U+009F
      if (b == 0xE2 && i + 2 < n && u[i + 1] == 0x80 && (u[i + 2] == 0xA8 || u[i + 2] == 0xA9)) return nullptr;
    }
  }
  if (!(seen & 1)) {
    std::memcpy(w, c, static_cast<size_t>(n));
    return w + n;
  }
  *w++ = '"';
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (c[i] == '"') *w++ = '"';
    *w++ = c[i];
  }
  *w++ = '"';
  return w;
}

}  // namespace

// `rows`: queued row tuples, a list or a RowBatch (row_batch.h: its records read directly); `cells`: statistic cell text (joined by ','), per handle (`by_row`
// false: a row whose handle is None gets `empty`) or per row; `names`: a dict dtype -> MindSpore
// name, filled through `name_of(dtype)` on a miss.  The UTF-8 bytes of the rows, or None.
pybind11::object encode_rows(const pybind11::object& rows, const pybind11::list& cells, bool by_row,
                             const pybind11::str& empty, const pybind11::dict& names, const pybind11::object& name_of) {
  using namespace opdump::contract;
  constexpr int kPieces = 11;     // op type, op name, task, stream, timestamp, io, slot, size, dtype, shape, cells
  const opdump::RowBatch* batch = opdump::row_batch_of(rows.ptr());    // records (row_batch.h), or a list
  if (batch == nullptr && !PyList_Check(rows.ptr())) return pybind11::none();
  std::vector<Piece> pieces;
  std::vector<pybind11::object> keep;   // every object a piece points into, alive while the GIL is released
  const Py_ssize_t n = batch != nullptr ? static_cast<Py_ssize_t>(batch->size()) : PyList_GET_SIZE(rows.ptr());
  const Py_ssize_t ncells = PyList_GET_SIZE(cells.ptr());
  if (by_row && ncells != n) return pybind11::none();
  pieces.reserve(static_cast<size_t>(n) * kPieces);
  keep.reserve(static_cast<size_t>(n) * 2 + 8);
  try {
    const Piece zero{"0", 1, 0, Piece::kRaw};
    const Piece empty_piece = text_piece(empty.ptr(), Piece::kRaw);
    auto dtype_piece = [&](PyObject* dtype) {
      PyObject* name = PyDict_GetItemWithError(names.ptr(), dtype);    // borrowed
      if (name == nullptr) {
        if (PyErr_Occurred()) throw pybind11::error_already_set();
        pybind11::object made = name_of(pybind11::reinterpret_borrow<pybind11::object>(dtype));
        if (PyDict_SetItem(names.ptr(), dtype, made.ptr()) < 0) throw pybind11::error_already_set();
        keep.push_back(made);
        name = made.ptr();
      }
      pieces.push_back(text_piece(name, Piece::kCsv));
    };
    auto cell_piece = [&](Py_ssize_t i, PyObject* h) {     // h: the row's handle (nullptr: None)
      PyObject* cell = nullptr;
      if (by_row) {
        cell = PyList_GET_ITEM(cells.ptr(), i);
      } else if (h != nullptr) {
        const Piece hp = int_piece(h);
        if (hp.v < 0 || hp.v >= ncells) throw Fallback();
        cell = PyList_GET_ITEM(cells.ptr(), static_cast<Py_ssize_t>(hp.v));
      }
      if (cell == nullptr) {
        pieces.push_back(empty_piece);
      } else {
        keep.emplace_back(pybind11::reinterpret_borrow<pybind11::object>(cell));
        pieces.push_back(text_piece(cell, Piece::kRaw));
      }
    };
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* r = nullptr;
      if (batch != nullptr) {
        const opdump::RowRecord& rec = batch->at(static_cast<size_t>(i));
        if (rec.tuple == nullptr) {      // a record: the batch keeps its objects alive
          pieces.push_back(text_piece(rec.op_type, Piece::kCsv));
          pieces.push_back(text_piece(rec.name, Piece::kCsv));
          pieces.push_back(zero);
          pieces.push_back(zero);      // stream 0
          Piece ts;
          ts.kind = Piece::kInt;
          ts.v = rec.ts;
          pieces.push_back(ts);
          pieces.push_back(text_piece(rec.io, Piece::kCsv));
          Piece slot = ts, bytes = ts;
          slot.v = rec.slot;
          bytes.v = rec.bytes;
          pieces.push_back(slot);
          pieces.push_back(bytes);
          dtype_piece(rec.dtype);
          pieces.push_back(text_piece(rec.shape, Piece::kCsv));
          if (by_row || rec.handle < 0) {
            cell_piece(i, nullptr);
          } else {
            if (rec.handle >= ncells) throw Fallback();
            PyObject* cell = PyList_GET_ITEM(cells.ptr(), static_cast<Py_ssize_t>(rec.handle));
            keep.emplace_back(pybind11::reinterpret_borrow<pybind11::object>(cell));
            pieces.push_back(text_piece(cell, Piece::kRaw));
          }
          continue;
        }
        r = rec.tuple;
      } else {
        r = PyList_GET_ITEM(rows.ptr(), i);
      }
      if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != kRowFields) throw Fallback();
      keep.emplace_back(pybind11::reinterpret_borrow<pybind11::object>(r));
      pieces.push_back(text_piece(PyTuple_GET_ITEM(r, kRowOpType), Piece::kCsv));
      pieces.push_back(text_piece(PyTuple_GET_ITEM(r, kRowOpName), Piece::kCsv));
      pieces.push_back(zero);
      pieces.push_back(field_piece(PyTuple_GET_ITEM(r, kRowStream)));
      pieces.push_back(int_piece(PyTuple_GET_ITEM(r, kRowTimestamp)));    // str(ts), never quoted
      pieces.push_back(field_piece(PyTuple_GET_ITEM(r, kRowIo)));
      pieces.push_back(field_piece(PyTuple_GET_ITEM(r, kRowSlot)));
      pieces.push_back(field_piece(PyTuple_GET_ITEM(r, kRowNbytes)));
      dtype_piece(PyTuple_GET_ITEM(r, kRowDtype));
      pieces.push_back(text_piece(PyTuple_GET_ITEM(r, kRowShape), Piece::kCsv));
      PyObject* h = PyTuple_GET_ITEM(r, kRowHandle);
      cell_piece(i, h == Py_None ? nullptr : h);
    }
  } catch (const Fallback&) {
    return pybind11::none();
  } catch (pybind11::error_already_set&) {
    PyErr_Clear();
    return pybind11::none();
  }
  std::string out;
  bool ok = true;
  {
    pybind11::gil_scoped_release unlocked;
    size_t room = 0;     // a bound: a quoted text at most doubles, plus its quotes and a separator
    for (const Piece& pc : pieces) room += pc.kind == Piece::kInt ? 24 : 2 * static_cast<size_t>(pc.n) + 3;
    out.resize(room);
    char* w = out.data();
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& pc = pieces[i];
      const size_t col = i % kPieces;
      if (col) *w++ = ',';
      if (pc.kind == Piece::kInt) {
        w = std::to_chars(w, w + 24, pc.v).ptr;
      } else if (pc.kind == Piece::kRaw) {
        std::memcpy(w, pc.p, static_cast<size_t>(pc.n));
        w += pc.n;
      } else if ((w = put_csv(w, pc.p, pc.n)) == nullptr) {
        ok = false;
        break;
      }
      if (col == kPieces - 1) *w++ = '\n';
    }
    if (ok) out.resize(static_cast<size_t>(w - out.data()));
  }
  if (!ok) return pybind11::none();
  PyObject* bytes = PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
  if (bytes == nullptr) {
    PyErr_Clear();
    return pybind11::none();
  }
  return pybind11::reinterpret_steal<pybind11::object>(bytes);
}
