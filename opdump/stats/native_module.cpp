// The module opdump/stats/native.py loads: the native parts and the contract they keep.
//
// Exports fused_stats and host_stats (cpu_kernel.cpp), format_cells (cell_text.cpp), StatsMemo
// (stats_memo.cpp), RowSink (row_sink.cpp), and every layout and code of contract.h as
// plain Python values, which native.py compares with opdump/stats/contract.py before
// using anything else here.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "contract.h"

pybind11::object fused_stats(const at::Tensor& x);
pybind11::object host_stats(const at::Tensor& x);
pybind11::object finite_bound(const at::Tensor& x);   // finite_bound.cpp (the overflow watch)
std::vector<std::string> format_cells(const pybind11::list& entries, const std::vector<int>& precisions,
                                      const std::vector<int>& kinds, const std::vector<int>& fused);
void register_stats_memo(pybind11::module& m);
void register_row_sink(pybind11::module& m);
void register_eager_observer(pybind11::module& m);   // opdump/capture/eager/native/observer.cpp
void register_graph_watch(pybind11::module& m);     // opdump/debug/graph_watch.cpp

namespace {

template <size_t N>
pybind11::tuple names(const char* const (&items)[N]) {
  pybind11::tuple t(N);
  for (size_t i = 0; i < N; ++i) t[i] = pybind11::str(items[i]);
  return t;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace opdump::contract;
  m.attr("ABI") = kAbi;
  m.attr("CELL_KINDS") = names(kCellKinds);
  m.attr("CELL_PRECISIONS") = names(kPrecisions);
  m.attr("FUSED_FIELDS") = names(kFusedFieldNames);
  m.attr("FUSED_CATEGORIES") = names(kFusedCategories);
  m.attr("ROW_FIELDS") = names(kRowFieldNames);
  m.attr("COPY_LIMIT") = kCopyLimit;
  m.attr("HOST_LANES") = kHostLanes;
  m.attr("HOST_CHUNK") = kHostChunk;
  m.def("fused_stats", &fused_stats, "max, min, sum, sum of squares of a dense CPU tensor, or None");
  m.def("host_stats", &host_stats,
        "fused_stats with the host mode's float64 accumulation (opdump/stats/host.py), or None");
  m.def("finite_bound", &finite_bound, "(max |x|, any sign bit) of a dense CPU float tensor (NaN/inf: one is), or None");
  m.def("format_cells", &format_cells, "statistic.csv cells of each entry, joined by ','");
  register_stats_memo(m);
  register_row_sink(m);
  register_eager_observer(m);
  register_graph_watch(m);
}
