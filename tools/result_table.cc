#include "tools/result_table.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/byte_size.h"

namespace remat::sim {
namespace {

bool IsArena(const SimRow& row) { return row.mode == "arena" || row.mode == "stitch"; }

std::string Number(double value) { return absl::StrFormat("%.6g", value); }

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

// One row as (column, value, is_string) cells, in CsvColumns() order; a missing value is nullopt-like "".
struct Cell {
  std::string value;
  bool is_string = false;
  bool is_null = false;
};

std::vector<Cell> Cells(const SimRow& row) {
  auto num = [](auto v) { return Cell{absl::StrCat(v), false, false}; };
  auto real = [](double v) { return Cell{Number(v), false, false}; };
  auto str = [](const std::string& v) { return Cell{v, true, false}; };
  return {
      str(row.trace),
      str(row.policy),
      str(row.mode),
      str(row.offload),
      real(row.ratio),
      num(row.budget_bytes),
      str(row.result),
      real(row.overhead),
      num(row.peak_bytes),
      num(row.replayed_cost_ns),
      num(row.evictions),
      num(row.rematerializations),
      num(row.heuristic_evaluations),
      num(row.search_time_ns),
      IsArena(row) ? real(row.fragmentation_rate) : Cell{"", false, true},
      num(row.wall_time_ns),
      num(row.baseline_compute_ns),
      num(row.baseline_memory_bytes),
      num(row.total_compute_ns),
      num(row.paged_out_bytes),
      num(row.paged_in_bytes),
      num(row.page_outs),
      num(row.page_ins),
      num(row.transfer_stall_ns),
      str(row.message),
  };
}

std::string Milliseconds(std::int64_t ns) { return absl::StrFormat("%.1f", static_cast<double>(ns) / 1e6); }

// Table labels: the fewest leading '-'-separated parts of each file name (".log" dropped) that still tell the
// table's traces apart, e.g. "resnet32" and "unet", or "bert-16" and "bert-32".
std::map<std::string, std::string> TraceLabels(const std::vector<SimRow>& rows) {
  std::vector<std::string> names;
  for (const SimRow& row : rows) {
    std::string name = TraceFileName(row.trace);
    if (absl::EndsWith(name, ".log")) name.resize(name.size() - 4);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  auto prefix = [](const std::string& name, std::size_t parts) {
    std::size_t end = 0;
    for (std::size_t i = 0; i < parts; ++i) {
      end = name.find('-', i == 0 ? 0 : end + 1);
      if (end == std::string::npos) return name;
    }
    return name.substr(0, end);
  };
  for (std::size_t parts = 1;; ++parts) {
    std::map<std::string, std::string> labels;
    std::set<std::string> seen;
    bool unique = true;  // distinct names are unique at the latest when every label is the whole name
    for (const std::string& name : names) {
      const std::string label = prefix(name, parts);
      unique = unique && seen.insert(label).second;
      labels[name] = label;
    }
    if (unique) {
      std::map<std::string, std::string> by_trace;
      for (const SimRow& row : rows) {
        std::string name = TraceFileName(row.trace);
        if (absl::EndsWith(name, ".log")) name.resize(name.size() - 4);
        by_trace[row.trace] = labels[name];
      }
      return by_trace;
    }
  }
}

}  // namespace

std::string TraceFileName(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> CsvColumns() {
  return {"trace",
          "policy",
          "mode",
          "offload",
          "ratio",
          "budget_bytes",
          "result",
          "overhead",
          "peak_bytes",
          "replayed_cost_ns",
          "evictions",
          "rematerializations",
          "heuristic_evaluations",
          "search_time_ns",
          "fragmentation_rate",
          "wall_time_ns",
          "baseline_compute_ns",
          "baseline_memory_bytes",
          "total_compute_ns",
          "paged_out_bytes",
          "paged_in_bytes",
          "page_outs",
          "page_ins",
          "transfer_stall_ns",
          "message"};
}

void WriteCsv(const std::vector<SimRow>& rows, std::ostream& out) {
  const std::vector<std::string> columns = CsvColumns();
  for (std::size_t i = 0; i < columns.size(); ++i) out << (i ? "," : "") << columns[i];
  out << '\n';
  for (const SimRow& row : rows) {
    const std::vector<Cell> cells = Cells(row);
    for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << CsvField(cells[i].value);
    out << '\n';
  }
}

void WriteJson(const std::vector<SimRow>& rows, std::ostream& out) {
  const std::vector<std::string> columns = CsvColumns();
  out << "[";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    out << (r ? ",\n " : "\n ") << "{";
    const std::vector<Cell> cells = Cells(rows[r]);
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out << (i ? ", " : "") << JsonString(columns[i]) << ": ";
      if (cells[i].is_null) {
        out << "null";
      } else if (cells[i].is_string) {
        out << JsonString(cells[i].value);
      } else {
        out << cells[i].value;
      }
    }
    out << "}";
  }
  out << (rows.empty() ? "]\n" : "\n]\n");
}

std::string FormatTable(const std::vector<SimRow>& rows) {
  struct Column {
    std::string title;
    bool right;  // numbers are right-aligned
  };
  const std::vector<Column> columns = {
      {"trace", false},     {"policy", false},   {"mode", false},    {"offload", false},
      {"ratio", true},      {"budget", true},    {"result", false},  {"overhead", true},
      {"peak", true},       {"replayed ms", true}, {"evictions", true}, {"remats", true},
      {"evals", true},      {"search ms", true}, {"frag", true},     {"paged out", true},
      {"paged in", true},   {"stall ms", true},  {"wall ms", true},
  };
  const std::map<std::string, std::string> labels = TraceLabels(rows);
  std::vector<std::vector<std::string>> cells;
  cells.reserve(rows.size() + 1);
  std::vector<std::string> header;
  for (const Column& column : columns) header.push_back(column.title);
  cells.push_back(header);
  for (const SimRow& row : rows) {
    cells.push_back({
        labels.at(row.trace),
        row.policy,
        row.mode,
        row.offload,
        absl::StrFormat(row.budget_given ? "%.4f" : "%.2f", row.ratio),
        FormatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(row.budget_bytes, 0))),
        row.result,
        // A run that did not pass stopped early: its overhead is only where it stopped.
        absl::StrFormat(row.result == "pass" ? "%.4f" : "(%.4f)", row.overhead),
        FormatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(row.peak_bytes, 0))),
        Milliseconds(row.replayed_cost_ns),
        absl::StrCat(row.evictions),
        absl::StrCat(row.rematerializations),
        absl::StrCat(row.heuristic_evaluations),
        Milliseconds(row.search_time_ns),
        IsArena(row) ? absl::StrFormat("%.4f", row.fragmentation_rate) : "-",
        FormatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(row.paged_out_bytes, 0))),
        FormatBytes(static_cast<std::uint64_t>(std::max<std::int64_t>(row.paged_in_bytes, 0))),
        Milliseconds(row.transfer_stall_ns),
        Milliseconds(row.wall_time_ns),
    });
  }
  std::vector<std::size_t> width(columns.size(), 0);
  for (const auto& line : cells) {
    for (std::size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  }
  std::string text;
  for (const auto& line : cells) {
    std::string out;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const std::size_t pad = width[i] - line[i].size();
      if (i) out += "  ";
      if (columns[i].right) out.append(pad, ' ');
      out += line[i];
      if (!columns[i].right && i + 1 < line.size()) out.append(pad, ' ');
    }
    text += out;
    text += '\n';
  }
  return text;
}

}  // namespace remat::sim
