// The layouts and codes that opdump's C++ shares with Python, defined once on this side.
//
// Why: a tuple position or an enum value that Python and C++ must agree on is a
// contract; kept equal by comments, the two sides drift silently.  Every such value is
// named here, exported by native_module.cpp, and compared at load by
// opdump/stats/native.py with its Python twin in opdump/stats/contract.py: any
// difference (a stale build, an edit on one side only) makes opdump warn once and use
// its Python path instead of the module.  Change both files together and bump kAbi.
#pragma once

#include <cstdint>

namespace opdump::contract {

// Bumped whenever a signature or a layout below changes.
constexpr int kAbi = 4;

// statistic.csv cell kinds (categories.py's Category.kind), as format_cells' `kinds`.
enum CellKind { kElement = 0, kComputed = 1, kCount = 2, kText = 3 };
inline constexpr const char* kCellKinds[] = {"element", "computed", "count", "text"};

// How an element value is written (format_cells' `precisions`): integer text, numpy's
// float16 or float32 str, Python's float repr.
enum Precision { kInteger = 0, kHalf = 1, kSingle = 2, kDouble = 3 };
inline constexpr const char* kPrecisions[] = {"integer", "half", "single", "double"};

// A fused entry: the tuple StatsMemo.stats gives for a tensor read now (fused_stats
// gives the first four).
enum FusedField { kFieldMax = 0, kFieldMin = 1, kFieldSum = 2, kFieldSumSq = 3, kFieldNumel = 4, kFusedFields = 5 };
inline constexpr const char* kFusedFieldNames[] = {"max", "min", "sum", "sum_of_squares", "numel"};

// The statistic categories a fused entry gives (format_cells' `fused` codes; -1: none).
enum FusedCategory { kCatMax = 0, kCatMin = 1, kCatAvg = 2, kCatL2 = 3, kCatCount = 4 };
inline constexpr const char* kFusedCategories[] = {"max", "min", "avg", "l2norm", "count"};

// One queued statistic.csv row, a flat tuple (see opdump/stats/contract.py ROW_FIELDS).
enum RowField {
  kRowOpType = 0, kRowOpName, kRowStream, kRowTimestamp, kRowIo, kRowSlot, kRowNbytes, kRowDtype, kRowShape,
  kRowHandle, kRowHostFuture, kRowFields
};
inline constexpr const char* kRowFieldNames[] = {"op_type", "op_name", "stream", "timestamp", "io", "slot", "nbytes",
                                                 "dtype", "shape", "device_handle", "host_future"};

// Tensors with gaps up to this many bytes are copied to contiguous memory, then read.
constexpr int64_t kCopyLimit = int64_t(32) << 20;

// The host mode's float64 summation order (cpu_kernel.cpp host_stats, and its numpy twin in
// opdump/stats/host.py): lanes per chunk, elements per chunk.
constexpr int64_t kHostLanes = 16;
constexpr int64_t kHostChunk = int64_t(1) << 16;

}  // namespace opdump::contract

static_assert(sizeof(opdump::contract::kRowFieldNames) / sizeof(char*) == opdump::contract::kRowFields,
              "one name per row field");
static_assert(sizeof(opdump::contract::kFusedFieldNames) / sizeof(char*) == opdump::contract::kFusedFields,
              "one name per fused field");
