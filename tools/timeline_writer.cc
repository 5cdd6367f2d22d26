#include "tools/timeline_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace remat::sim {
namespace {

std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string TimelineJson(const std::vector<TimelineSample>& samples, const std::string& title) {
  std::string out = "{\"traceEvents\": [\n";
  std::int64_t replays = 0;
  bool first = true;
  auto event = [&](const std::string& text) {
    absl::StrAppend(&out, first ? "" : ",\n", text);
    first = false;
  };
  for (const TimelineSample& s : samples) {
    const double ts = static_cast<double>(s.clock_ns) / 1000.0;  // microseconds, as Chrome traces count
    event(absl::StrFormat(R"j({"ph": "C", "pid": 1, "tid": 0, "ts": %.3f, "name": "memory (bytes)", )j"
                          R"j("args": {"in use": %d, "paged out": %d}})j",
                          ts, s.used_bytes, s.paged_out_bytes));
    event(absl::StrFormat(R"j({"ph": "C", "pid": 1, "tid": 0, "ts": %.3f, )j"
                          R"j("name": "evicted, released and rematerialized (bytes, so far)", )j"
                          R"j("args": {"evicted": %d, "released, recomputable": %d, "rematerialized": %d}})j",
                          ts, s.evicted_bytes, s.released_bytes, s.rematerialized_bytes));
    if (s.rematerializations > replays) {
      event(absl::StrFormat(R"j({"ph": "X", "pid": 1, "tid": 0, "ts": %.3f, "dur": 0, "name": "replay", )j"
                            R"j("cat": "replay", "args": {"ops": %d}})j",
                            ts, s.rematerializations - replays));
      replays = s.rematerializations;
    }
  }
  absl::StrAppend(&out, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"remat\", \"source\": ",
                  "\"remat-sim\", \"title\": ", Quoted(title), "}}\n");
  return out;
}

absl::Status WriteTimeline(const std::vector<TimelineSample>& samples, const std::string& title,
                           const std::string& path) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  file << TimelineJson(samples, title);
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat("writing ", path, " failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace remat::sim
