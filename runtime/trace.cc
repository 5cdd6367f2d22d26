// Trace parsing: one JSON object per line, tokenized by simdjson (Debian libsimdjson-dev), then built into
// instructions here. simdjson's DOM API, because it picks the CPU's fastest kernel at run time; its ondemand API is
// inlined and, in a portable build, gets only the scalar "fallback" kernel.
//
// This file used to hand-write the tokenizer, "a few times faster than a general JSON library", never measured.
// bench/trace_parse_bench.cc measures them on the five shared traces (README.md, Results, "Trace parsing"):
// simdjson's DOM API tokenizes as fast as the hand-written code did (1.00x its time over the five traces, 1.03x
// on lstm), its ondemand API (fallback kernel) takes 1.41x, nlohmann-json 8.4x. Parsing is about a third of a
// one-run remat-sim on the LSTM trace (10 of 32 ms), so an 8x tokenizer would show; simdjson's DOM does not.
#include "runtime/trace.h"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/byte_size.h"

namespace remat {
namespace {

// One JSON scalar or array of scalars, as text: strings unescaped, numbers as simdjson writes them (the builder
// converts either).
struct Value {
  bool is_array = false;
  absl::string_view text;
  std::vector<absl::string_view> items;
};

struct Field {
  absl::string_view key;
  Value value;
};

// Splits a line's JSON object into fields. The views stay valid until the next line is parsed.
class LineParser {
 public:
  // `line` lies in a buffer with `readable` bytes from line.data() on. Returns an error reason or empty.
  std::string Parse(absl::string_view line, std::size_t readable, std::vector<Field>& fields) {
    fields.clear();
    numbers_.clear();
    const char* data = line.data();
    if (readable < line.size() + simdjson::SIMDJSON_PADDING) {  // simdjson reads ahead; near the end, a copy
      padded_.assign(line.data(), line.size());
      padded_.resize(line.size() + simdjson::SIMDJSON_PADDING);
      data = padded_.data();
    }
    simdjson::dom::element root;
    if (auto error = parser_.parse(data, line.size(), /*realloc_if_needed=*/false).get(root)) {
      return simdjson::error_message(error);
    }
    simdjson::dom::object object;
    if (root.get_object().get(object) != simdjson::SUCCESS) return "expected an object";
    for (auto [key, value] : object) {
      Field f{absl::string_view(key.data(), key.size()), {}};
      simdjson::dom::array array;
      if (value.get_array().get(array) == simdjson::SUCCESS) {
        f.value.is_array = true;
        for (simdjson::dom::element item : array) {
          if (!Scalar(item, f.value.items.emplace_back())) {
            return absl::StrCat("\"", f.key, "\" holds an element that is not a string or a number");
          }
        }
      } else if (!Scalar(value, f.value.text)) {
        return absl::StrCat("\"", f.key, "\" is not a string, a number or an array of those");
      }
      fields.push_back(std::move(f));
    }
    return {};
  }

 private:
  bool Scalar(simdjson::dom::element v, absl::string_view& out) {
    std::string_view s;
    if (v.get_string().get(s) == simdjson::SUCCESS) {
      out = absl::string_view(s.data(), s.size());
      return true;
    }
    if (!v.is_number()) return false;
    out = numbers_.emplace_back(simdjson::minify(v));
    return true;
  }

  simdjson::dom::parser parser_;
  std::string padded_;                // the last lines of the text, with simdjson's padding after them
  std::deque<std::string> numbers_;   // this line's numbers as text (a deque: the views into it stay valid)
};

const Value* Find(const std::vector<Field>& fields, absl::string_view key) {
  for (const Field& f : fields) {
    if (f.key == key) return &f.value;
  }
  return nullptr;
}

bool ToInt(absl::string_view text, std::int64_t& out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  if (ec == std::errc() && ptr == end) return true;
  // Some recorders write floats ("123.0"); accept integral values.
  double d = 0;
  auto [p2, ec2] = std::from_chars(text.data(), end, d);
  if (ec2 != std::errc() || p2 != end || !(std::fabs(d) < 0x1p63)) return false;  // the cast below is defined
  if (d != static_cast<double>(static_cast<std::int64_t>(d))) return false;
  out = static_cast<std::int64_t>(d);
  return true;
}

class Builder {
 public:
  Builder(std::string path) { trace_.path = std::move(path); }

  absl::Status Error(int line, absl::string_view reason) {
    return absl::InvalidArgumentError(absl::StrCat(trace_.path, ":", line, ": ", reason));
  }

  TraceName Intern(absl::string_view name) {
    auto [it, inserted] = ids_.try_emplace(name, static_cast<TraceName>(trace_.names.size()));
    if (inserted) {
      trace_.names.emplace_back(name);
      defined_.push_back(false);
    }
    return it->second;
  }

  // Returns the id of a name that must already be defined, or -1.
  TraceName Lookup(absl::string_view name) const {
    auto it = ids_.find(name);
    if (it == ids_.end() || !defined_[it->second]) return -1;
    return it->second;
  }

  // `text` lies in a buffer with `readable` bytes from text.data() on (the line parser may read ahead).
  absl::Status Line(int line, absl::string_view text, std::size_t readable) {
    std::vector<Field>& fields = fields_;
    std::string reason = line_parser_.Parse(text, readable, fields);
    if (!reason.empty()) return Error(line, absl::StrCat("malformed JSON line: ", reason));
    const Value* instr = Find(fields, "INSTRUCTION");
    if (instr == nullptr || instr->is_array) return Error(line, "missing INSTRUCTION");
    absl::string_view kind = instr->text;

    // Pending MEMORY/ALIAS lines for the previous CONSTANT or CALL.
    if (pending_ != Pending::kNone) {
      return ContinuePending(line, kind, fields);
    }
    if (!started_) {
      if (kind == "ANNOTATE") {
        const Value* a = Find(fields, "ANNOTATION");
        if (a != nullptr && !a->is_array && a->text == "START") {
          started_ = true;
          Reset();
          return absl::OkStatus();
        }
      }
    }
    return Instruction(line, kind, fields);
  }

  absl::StatusOr<Trace> Finish(int last_line) {
    if (pending_ != Pending::kNone) {
      return Error(last_line, pending_ == Pending::kConstantMemory
                                  ? "CONSTANT without its MEMORY line (end of file)"
                                  : "CALL result without its MEMORY/ALIAS lines (end of file)");
    }
    return std::move(trace_);
  }

 private:
  enum class Pending { kNone, kConstantMemory, kCallMemory, kCallAlias };

  // Before START the trace may hold instructions we must not replay; START discards them.
  void Reset() {
    trace_.ops.clear();
    trace_.call_count = 0;
    trace_.total_time_ns = 0;
    // Names defined before START are not available after it (the replay starts from an empty state).
    std::fill(defined_.begin(), defined_.end(), false);
  }

  absl::Status NeedName(int line, const std::vector<Field>& fields, absl::string_view key, absl::string_view& out) {
    const Value* v = Find(fields, key);
    if (v == nullptr || v->is_array) return Error(line, absl::StrCat("missing ", key));
    out = v->text;
    return absl::OkStatus();
  }

  absl::Status NeedInt(int line, const std::vector<Field>& fields, absl::string_view key, std::int64_t& out) {
    const Value* v = Find(fields, key);
    if (v == nullptr || v->is_array) return Error(line, absl::StrCat("missing ", key));
    if (!ToInt(v->text, out)) return Error(line, absl::StrCat(key, " is not an integer: '", v->text, "'"));
    return absl::OkStatus();
  }

  // A MEMORY or TIME value: an integer from 0 to kMaxQuantity, added to `total` (all of the trace's MEMORY values,
  // or its TIME values), which must stay within kMaxQuantity too: then no peak or clock can wrap.
  absl::Status NeedQuantity(int line, const std::vector<Field>& fields, absl::string_view key, std::int64_t& out,
                            std::int64_t& total) {
    if (absl::Status s = NeedInt(line, fields, key, out); !s.ok()) return s;
    if (out < 0) return Error(line, absl::StrCat("negative ", key));
    constexpr auto kMax = static_cast<std::int64_t>(kMaxQuantity);
    if (out > kMax) {
      return Error(line, absl::StrCat(key, " ", out, " is above 2^53 (", key == "TIME" ? "104 days in ns" : "8 PiB",
                                      "), the largest value remat accepts"));
    }
    if (total > kMax - out) {
      return Error(line, absl::StrCat("the trace's ", key, " values add up to more than 2^53 here; remat accepts "
                                      "traces whose sums stay below, so that no peak or clock can wrap"));
    }
    total += out;
    return absl::OkStatus();
  }

  absl::Status Defined(int line, absl::string_view name, absl::string_view what, TraceName& out) {
    out = Lookup(name);
    if (out < 0) return Error(line, absl::StrCat("unknown name '", name, "' in ", what));
    return absl::OkStatus();
  }

  absl::Status Instruction(int line, absl::string_view kind, const std::vector<Field>& fields) {
    TraceOp op;
    op.line = line;
    if (kind == "ANNOTATE") {
      absl::string_view a;
      if (absl::Status s = NeedName(line, fields, "ANNOTATION", a); !s.ok()) return s;
      op.kind = TraceOpKind::kAnnotate;
      op.op_name = std::string(a);
      trace_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    if (kind == "CONSTANT") {
      absl::string_view name;
      if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
      op.kind = TraceOpKind::kConstant;
      op.name = Intern(name);
      trace_.ops.push_back(std::move(op));
      pending_ = Pending::kConstantMemory;
      pending_line_ = line;
      return absl::OkStatus();
    }
    if (kind == "CALL" || kind == "MUTATE") {
      absl::string_view name;
      if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
      op.op_name = std::string(name);
      std::int64_t& total_time = trace_.total_time_ns;
      if (absl::Status s = NeedQuantity(line, fields, "TIME", op.time_ns, total_time); !s.ok()) return s;
      const Value* args = Find(fields, "ARGS");
      if (args == nullptr || !args->is_array) return Error(line, "missing ARGS array");
      for (absl::string_view a : args->items) {
        TraceName id;
        if (absl::Status s = Defined(line, a, "ARGS", id); !s.ok()) return s;
        op.args.push_back(id);
      }
      trace_.call_count++;
      if (kind == "MUTATE") {
        op.kind = TraceOpKind::kMutate;
        const Value* m = Find(fields, "MUTATE");
        if (m == nullptr || !m->is_array) return Error(line, "missing MUTATE array");
        for (absl::string_view t : m->items) {
          std::int64_t k;
          if (!ToInt(t, k) || k < 0 || k >= static_cast<std::int64_t>(op.args.size())) {
            return Error(line, absl::StrCat("MUTATE index '", t, "' out of range"));
          }
          op.mutated.push_back(static_cast<std::int32_t>(k));
        }
        trace_.ops.push_back(std::move(op));
        return absl::OkStatus();
      }
      op.kind = TraceOpKind::kCall;
      const Value* res = Find(fields, "RESULT");
      if (res == nullptr || !res->is_array) return Error(line, "missing RESULT array");
      for (absl::string_view r : res->items) {
        TraceResult tr;
        tr.name = Intern(r);
        op.results.push_back(tr);
      }
      trace_.ops.push_back(std::move(op));
      if (!trace_.ops.back().results.empty()) {
        pending_ = Pending::kCallMemory;
        pending_index_ = 0;
        pending_line_ = line;
      }
      return absl::OkStatus();
    }
    if (kind == "COPY" || kind == "COPY_FROM") {
      absl::string_view dst, src;
      if (absl::Status s = NeedName(line, fields, "DST", dst); !s.ok()) return s;
      if (absl::Status s = NeedName(line, fields, "SRC", src); !s.ok()) return s;
      TraceName src_id;
      if (absl::Status s = Defined(line, src, "SRC", src_id); !s.ok()) return s;
      op.kind = kind == "COPY" ? TraceOpKind::kCopy : TraceOpKind::kCopyFrom;
      op.args.push_back(src_id);
      TraceResult tr;
      tr.name = Intern(dst);
      defined_[tr.name] = true;
      op.results.push_back(tr);
      trace_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    if (kind == "RELEASE") {
      absl::string_view name;
      if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
      op.kind = TraceOpKind::kRelease;
      op.args.push_back(Intern(name));
      trace_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    if (kind == "PIN") {
      absl::string_view name;
      if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
      TraceName id;
      if (absl::Status s = Defined(line, name, "NAME", id); !s.ok()) return s;
      op.kind = TraceOpKind::kPin;
      op.args.push_back(id);
      trace_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    if (kind == "MEMORY" || kind == "ALIAS") {
      return Error(line, absl::StrCat(kind, " line without a preceding CONSTANT or CALL result"));
    }
    return Error(line, absl::StrCat("unknown INSTRUCTION '", kind, "'"));
  }

  absl::Status ContinuePending(int line, absl::string_view kind, const std::vector<Field>& fields) {
    TraceOp& op = trace_.ops.back();
    absl::string_view name;
    if (pending_ == Pending::kConstantMemory) {
      if (kind != "MEMORY") {
        return Error(line, absl::StrCat("CONSTANT '", trace_.names[op.name], "' (line ", pending_line_,
                                        ") without its MEMORY line"));
      }
      if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
      if (name != trace_.names[op.name]) {
        return Error(line, absl::StrCat("MEMORY for '", name, "' but the CONSTANT was '", trace_.names[op.name],
                                        "'"));
      }
      if (absl::Status s = NeedQuantity(line, fields, "MEMORY", op.bytes, memory_total_); !s.ok()) return s;
      defined_[op.name] = true;
      pending_ = Pending::kNone;
      return absl::OkStatus();
    }
    TraceResult& r = op.results[pending_index_];
    const std::string& expect = trace_.names[r.name];
    if (pending_ == Pending::kCallMemory) {
      if (kind != "MEMORY") {
        return Error(line, absl::StrCat("CALL result '", expect, "' (line ", pending_line_,
                                        ") without its MEMORY line"));
      }
      if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
      if (name != expect) {
        return Error(line, absl::StrCat("MEMORY for '", name, "' but the next CALL result is '", expect, "'"));
      }
      if (absl::Status s = NeedQuantity(line, fields, "MEMORY", r.bytes, memory_total_); !s.ok()) return s;
      pending_ = Pending::kCallAlias;
      return absl::OkStatus();
    }
    // kCallAlias
    if (kind != "ALIAS") {
      return Error(line, absl::StrCat("CALL result '", expect, "' (line ", pending_line_,
                                      ") without its ALIAS line"));
    }
    if (absl::Status s = NeedName(line, fields, "NAME", name); !s.ok()) return s;
    if (name != expect) {
      return Error(line, absl::StrCat("ALIAS for '", name, "' but the next CALL result is '", expect, "'"));
    }
    std::int64_t alias;
    if (absl::Status s = NeedInt(line, fields, "ALIAS", alias); !s.ok()) return s;
    if (alias < -1 || alias >= static_cast<std::int64_t>(op.args.size())) {
      return Error(line, absl::StrCat("ALIAS ", alias, " out of range (the op has ", op.args.size(), " args)"));
    }
    r.alias = static_cast<std::int32_t>(alias);
    defined_[r.name] = true;
    if (++pending_index_ < op.results.size()) {
      pending_ = Pending::kCallMemory;
    } else {
      pending_ = Pending::kNone;
    }
    return absl::OkStatus();
  }

  Trace trace_;
  absl::flat_hash_map<std::string, TraceName> ids_;
  std::vector<bool> defined_;
  LineParser line_parser_;
  std::vector<Field> fields_;
  bool started_ = false;
  Pending pending_ = Pending::kNone;
  std::size_t pending_index_ = 0;
  int pending_line_ = 0;
  std::int64_t memory_total_ = 0;  // every MEMORY value so far (NeedQuantity)
};

}  // namespace

absl::StatusOr<Trace> ParseTrace(std::string_view std_text, std::string path) {
  absl::string_view text(std_text.data(), std_text.size());
  Builder builder(std::move(path));
  int line = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view l = text.substr(pos, end - pos);
    const std::size_t readable = text.size() - pos;  // from the line's start to the end of the text
    ++line;
    pos = end + 1;
    bool blank = true;
    for (char c : l) {
      if (c != ' ' && c != '\t' && c != '\r') {
        blank = false;
        break;
      }
    }
    if (blank) continue;
    if (absl::Status s = builder.Line(line, l, readable); !s.ok()) return s;
  }
  return builder.Finish(line);
}

absl::StatusOr<Trace> ReadTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the trace file"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  std::string text = std::move(buffer).str();
  return ParseTrace(std::string_view(text), path);
}

}  // namespace remat
