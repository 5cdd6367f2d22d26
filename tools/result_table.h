// ResultTable: the rows `remat-sim` reports, and their three renderings (aligned text, CSV, JSON).
//
// Contract:
//   - One SimRow per (trace, policy, ratio or budget). Raw units everywhere in files (bytes, nanoseconds); the
//     text table uses readable units (FormatBytes from runtime/byte_size.h, milliseconds, seconds).
//   - `ratio` is always the budget relative to the baseline peak: the requested ratio, or budget / baseline
//     peak when an absolute budget was requested (`budget_given` tells which).
//   - `fragmentation_rate` only means something in arena mode; in counter mode it is written as an empty CSV
//     field, JSON null and "-" in the table.
//   - CSV: RFC 4180 (a field containing a comma, quote or newline is quoted, quotes doubled), a header line with
//     the names in CsvColumns(), '\n' line ends. JSON: an array of objects with the same keys, numbers as JSON
//     numbers, strings escaped (control characters as \u00XX), so both load with standard readers.
//   - FormatTable pads every column to its widest cell (numbers right-aligned, text left-aligned) and ends each
//     line with '\n'. The trace column shows the fewest leading '-'-separated parts of the file name (no
//     directory, no ".log") that still tell the table's traces apart ("resnet32", or "bert-16" and "bert-32").
//   - In the table, the overhead of a run that did not pass is in parentheses: the run stopped early (oom,
//     thrash), so it is the clock where it stopped, not a cost of finishing. Files keep the plain number.
//   - Paging: `offload` is the run's offload mode ("off", "auto", "always"); bytes paged out and in, page-out and
//     page-in counts (prefetches included) and the transfer stall (clock time ops waited for page-ins) are in
//     CSV/JSON; the table shows the mode, bytes paged out and in, and the stall in ms.
//   - Numbers are written with enough digits to round-trip what matters: overhead and ratios with 6 significant
//     digits in files, 4 decimals in the table.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace remat::sim {

struct SimRow {
  std::string trace;                  // file name (no directory)
  std::string policy;
  std::string mode;                   // "counter" or "arena"
  std::string offload = "off";        // "off", "auto" or "always"
  double ratio = 0;
  bool budget_given = false;          // true when the row came from --budgets
  std::int64_t budget_bytes = 0;
  std::string result;                 // "pass", "oom", "thrash" or "error"
  double overhead = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t replayed_cost_ns = 0;
  std::int64_t evictions = 0;
  std::int64_t rematerializations = 0;
  std::int64_t heuristic_evaluations = 0;
  std::int64_t search_time_ns = 0;
  double fragmentation_rate = 0;      // meaningful in arena mode only
  std::int64_t wall_time_ns = 0;
  std::int64_t baseline_compute_ns = 0;
  std::int64_t baseline_memory_bytes = 0;
  std::int64_t total_compute_ns = 0;
  std::int64_t paged_out_bytes = 0;
  std::int64_t paged_in_bytes = 0;
  std::int64_t page_outs = 0;
  std::int64_t page_ins = 0;          // prefetches included
  std::int64_t transfer_stall_ns = 0; // included in overhead
  std::string message;                // why it did not pass; empty on pass
};

std::vector<std::string> CsvColumns();

void WriteCsv(const std::vector<SimRow>& rows, std::ostream& out);
void WriteJson(const std::vector<SimRow>& rows, std::ostream& out);
std::string FormatTable(const std::vector<SimRow>& rows);

// "resnet32-56-...-default.log" from "/a/b/resnet32-56-...-default.log"; ".log" kept (it is the file name).
std::string TraceFileName(const std::string& path);

}  // namespace remat::sim
