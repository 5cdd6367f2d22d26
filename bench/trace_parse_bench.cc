// Trace parsing (issue 22, item 7): is the hand-written JSON tokenizer the trace reader used worth keeping, or do
// the field's libraries serve? Every line of the five shared DTR traces (../shared/traces/dtr/*.log, 5.0 MiB,
// 92,808 lines) is tokenized by
//   Handwritten  the flat-object line parser runtime/trace.cc hand-wrote until issue 22 (verbatim, the reference),
//   Nlohmann     nlohmann::json::parse per line (the DOM; Debian nlohmann-json3-dev 3.11.2),
//   Simdjson     simdjson's ondemand API per line (Debian libsimdjson-dev 3.0.1). It is inlined and compiled
//                for the build's target only: a portable x86-64 build gets simdjson's "fallback" (scalar) kernel,
//   SimdjsonDom  simdjson's DOM API per line, which picks the CPU's best kernel at run time (haswell, icelake;
//                the context line "simdjson_dom_kernel" names it): what runtime/trace.cc uses,
// each into the same list of (key, string or array of strings) fields, and then the same lookups the trace
// builder does run on that list (INSTRUCTION; NAME, TIME, MEMORY, ALIAS, ARGS, RESULT, MUTATE, DST, SRC,
// ANNOTATION as the instruction needs; integers converted), folded into a checksum that must agree across the
// three. ParseTrace is the runtime's whole reader (tokenizer + names interned + instructions built), whichever
// tokenizer it uses, for the share the tokenizer has in it.
//
//   build/bench/trace_parse_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// The traces come from $REMAT_SHARED_DIR/traces/dtr (default: the CMake REMAT_SHARED_DIR). Figures: README.md,
// "Results", "Trace parsing: hand-written tokenizer against simdjson and nlohmann-json".
#include <benchmark/benchmark.h>

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "runtime/trace.h"

namespace remat {
namespace {

struct SharedTrace {
  std::string name;
  std::string text;
  simdjson::padded_string padded;  // the same bytes with simdjson's padding after them
};

const std::vector<SharedTrace>& Traces() {
  static const std::vector<SharedTrace>* traces = [] {
    const char* env = std::getenv("REMAT_SHARED_DIR");
    const std::string dir = std::string(env != nullptr && *env ? env : REMAT_SHARED_DIR_DEFAULT) + "/traces/dtr/";
    auto* out = new std::vector<SharedTrace>;
    for (const char* name : {"resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log",
                             "unet-6-8000000000.0-2020-10-1-10-57-18-default.log",
                             "transformer-10-8000000000.0-2020-10-1-10-56-5-default.log",
                             "tv_densenet121-84-10000000000.0-2020-10-1-13-41-18-default.log",
                             "lstm-128-11000000000.0-2020-10-1-16-38-52-default.log"}) {
      std::ifstream in(dir + name, std::ios::binary);
      if (!in) continue;
      std::ostringstream buffer;
      buffer << in.rdbuf();
      std::string text = buffer.str();
      simdjson::padded_string padded(text);
      out->push_back(SharedTrace{std::string(name).substr(0, std::string(name).find('-')), std::move(text),
                                 std::move(padded)});
    }
    return out;
  }();
  return *traces;
}

// What every tokenizer produces for a line: the fields in order, values as text (strings unquoted, numbers as
// written), arrays as lists of such texts. The views stay valid until the next line is tokenized.
struct Value {
  bool is_array = false;
  std::string_view text;
  std::vector<std::string_view> items;
};
struct Field {
  std::string_view key;
  Value value;
};

// ---- (a) the hand-written tokenizer, as runtime/trace.cc had it ----
class HandwrittenLineParser {
 public:
  explicit HandwrittenLineParser(std::string_view s) : s_(s) {}
  std::string Parse(std::vector<Field>& fields) {
    fields.clear();
    SkipWs();
    if (!Eat('{')) return "expected '{'";
    SkipWs();
    if (Eat('}')) return Trailing();
    while (true) {
      SkipWs();
      Field f;
      if (!String(f.key)) return "expected a string key";
      SkipWs();
      if (!Eat(':')) return "expected ':'";
      SkipWs();
      if (Eat('[')) {
        f.value.is_array = true;
        SkipWs();
        if (!Eat(']')) {
          while (true) {
            SkipWs();
            std::string_view item;
            if (!Scalar(item)) return "expected a string or number in array";
            f.value.items.push_back(item);
            SkipWs();
            if (Eat(']')) break;
            if (!Eat(',')) return "expected ',' or ']'";
          }
        }
      } else if (!Scalar(f.value.text)) {
        return "expected a value";
      }
      fields.push_back(std::move(f));
      SkipWs();
      if (Eat('}')) return Trailing();
      if (!Eat(',')) return "expected ',' or '}'";
    }
  }

 private:
  std::string Trailing() {
    SkipWs();
    return i_ == s_.size() ? std::string() : std::string("trailing characters after '}'");
  }
  void SkipWs() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String(std::string_view& out) {
    if (!Eat('"')) return false;
    std::size_t start = i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;
      ++i_;
    }
    if (i_ >= s_.size()) return false;
    out = s_.substr(start, i_ - start);
    ++i_;
    return true;
  }
  bool Scalar(std::string_view& out) {
    if (i_ < s_.size() && s_[i_] == '"') return String(out);
    std::size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                              s_[i_] == '+' || s_[i_] == '.')) {
      ++i_;
    }
    out = s_.substr(start, i_ - start);
    return !out.empty();
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

// ---- (b) nlohmann-json: the DOM of the line, then its members as fields ----
class NlohmannLineParser {
 public:
  bool Parse(std::string_view line, std::vector<Field>& fields) {
    fields.clear();
    doc_ = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (!doc_.is_object()) return false;
    numbers_.clear();
    for (const auto& [key, value] : doc_.items()) {
      Field f;
      f.key = key;  // items() keys reference the object's own keys
      if (value.is_array()) {
        f.value.is_array = true;
        for (const nlohmann::json& item : value) {
          std::string_view text;
          if (!Scalar(item, text)) return false;
          f.value.items.push_back(text);
        }
      } else if (!Scalar(value, f.value.text)) {
        return false;
      }
      fields.push_back(std::move(f));
    }
    return true;
  }

 private:
  bool Scalar(const nlohmann::json& v, std::string_view& out) {
    if (v.is_string()) {
      out = v.get_ref<const std::string&>();
      return true;
    }
    if (!v.is_number()) return false;
    numbers_.push_back(v.dump());
    out = numbers_.back();
    return true;
  }

  nlohmann::json doc_;
  std::deque<std::string> numbers_;  // the texts of numbers (a deque: views into it stay valid)
};

// ---- (c) simdjson ondemand: iterate the line's object once ----
class SimdjsonLineParser {
 public:
  // `line` lies inside a buffer with at least SIMDJSON_PADDING bytes allocated after `capacity_end`.
  bool Parse(const char* line, std::size_t length, std::size_t capacity, std::vector<Field>& fields) {
    fields.clear();
    simdjson::ondemand::document doc;
    if (parser_.iterate(line, length, capacity).get(doc) != simdjson::SUCCESS) return false;
    simdjson::ondemand::object object;
    if (doc.get_object().get(object) != simdjson::SUCCESS) return false;
    for (auto member : object) {
      simdjson::ondemand::field field;
      if (std::move(member).get(field) != simdjson::SUCCESS) return false;
      Field f;
      if (field.unescaped_key().get(f.key) != simdjson::SUCCESS) return false;
      simdjson::ondemand::value value = field.value();
      simdjson::ondemand::json_type type;
      if (value.type().get(type) != simdjson::SUCCESS) return false;
      if (type == simdjson::ondemand::json_type::array) {
        f.value.is_array = true;
        simdjson::ondemand::array array;
        if (value.get_array().get(array) != simdjson::SUCCESS) return false;
        for (auto element : array) {
          simdjson::ondemand::value item;
          std::string_view text;
          if (std::move(element).get(item) != simdjson::SUCCESS || !Scalar(item, text)) return false;
          f.value.items.push_back(text);
        }
      } else if (!Scalar(value, f.value.text)) {
        return false;
      }
      fields.push_back(std::move(f));
    }
    return doc.current_location().error() == simdjson::OUT_OF_BOUNDS;  // nothing after the object
  }

 private:
  static bool Scalar(simdjson::ondemand::value& v, std::string_view& out) {
    simdjson::ondemand::json_type type;
    if (v.type().get(type) != simdjson::SUCCESS) return false;
    if (type == simdjson::ondemand::json_type::string) return v.get_string().get(out) == simdjson::SUCCESS;
    if (type != simdjson::ondemand::json_type::number) return false;
    out = v.raw_json_token();
    while (!out.empty() && (out.back() == ' ' || out.back() == '\t' || out.back() == '\r')) out.remove_suffix(1);
    return true;
  }

  simdjson::ondemand::parser parser_;
};

// ---- (c') simdjson's DOM API, dispatched at run time to the CPU's best kernel (runtime/trace.cc's tokenizer) ----
class SimdjsonDomLineParser {
 public:
  bool Parse(const char* line, std::size_t length, std::vector<Field>& fields) {
    fields.clear();
    numbers_.clear();
    simdjson::dom::object object;
    if (parser_.parse(line, length, /*realloc_if_needed=*/false).get(object) != simdjson::SUCCESS) return false;
    for (auto [key, value] : object) {
      Field f;
      f.key = key;
      simdjson::dom::array array;
      if (value.get_array().get(array) == simdjson::SUCCESS) {
        f.value.is_array = true;
        for (simdjson::dom::element item : array) {
          std::string_view text;
          if (!Scalar(item, text)) return false;
          f.value.items.push_back(text);
        }
      } else if (!Scalar(value, f.value.text)) {
        return false;
      }
      fields.push_back(std::move(f));
    }
    return true;
  }

 private:
  bool Scalar(simdjson::dom::element v, std::string_view& out) {
    if (v.get_string().get(out) == simdjson::SUCCESS) return true;
    std::int64_t i;
    if (v.get_int64().get(i) != simdjson::SUCCESS) return false;  // (the traces' only numbers are MUTATE indices)
    numbers_.push_back(std::to_string(i));
    out = numbers_.back();
    return true;
  }

  simdjson::dom::parser parser_;
  std::deque<std::string> numbers_;
};

// ---- the lookups the trace builder makes, the same for every tokenizer ----
const Value* Find(const std::vector<Field>& fields, std::string_view key) {
  for (const Field& f : fields) {
    if (f.key == key) return &f.value;
  }
  return nullptr;
}

std::int64_t Int(const Value* v) {
  std::int64_t out = 0;
  if (v != nullptr) std::from_chars(v->text.data(), v->text.data() + v->text.size(), out);
  return out;
}

std::uint64_t Text(const Value* v) {
  return v == nullptr ? 0 : v->text.size() * 31 + (v->text.empty() ? 0 : v->text[0]);
}

std::uint64_t Items(const Value* v) {
  std::uint64_t sum = 0;
  if (v != nullptr) {
    for (std::string_view item : v->items) sum = sum * 7 + item.size() + static_cast<unsigned char>(item.back());
  }
  return sum;
}

std::uint64_t Visit(const std::vector<Field>& fields) {
  const Value* instruction = Find(fields, "INSTRUCTION");
  if (instruction == nullptr) return 1;
  const std::string_view kind = instruction->text;
  std::uint64_t sum = Text(instruction) + Text(Find(fields, "NAME"));
  if (kind == "CALL" || kind == "MUTATE") {
    sum += static_cast<std::uint64_t>(Int(Find(fields, "TIME"))) + Items(Find(fields, "ARGS"));
    sum += Items(Find(fields, kind == "CALL" ? "RESULT" : "MUTATE"));
  } else if (kind == "MEMORY") {
    sum += static_cast<std::uint64_t>(Int(Find(fields, "MEMORY")));
  } else if (kind == "ALIAS") {
    sum += static_cast<std::uint64_t>(Int(Find(fields, "ALIAS")) + 1);
  } else if (kind == "COPY" || kind == "COPY_FROM") {
    sum += Text(Find(fields, "DST")) + Text(Find(fields, "SRC"));
  } else if (kind == "ANNOTATE") {
    sum += Text(Find(fields, "ANNOTATION"));
  }
  return sum;
}

// Calls `parse(begin, length, fields)` on every non-blank line of `text`; returns the checksum or 0 on an error.
template <typename Parse>
std::uint64_t EachLine(std::string_view text, Parse&& parse) {
  std::vector<Field> fields;
  std::uint64_t sum = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (end > pos) {
      if (!parse(pos, end - pos, fields)) return 0;
      sum = sum * 3 + Visit(fields);
    }
    pos = end + 1;
  }
  return sum;
}

std::uint64_t Handwritten(const SharedTrace& t) {
  return EachLine(t.text, [&](std::size_t pos, std::size_t n, std::vector<Field>& fields) {
    return HandwrittenLineParser(std::string_view(t.text).substr(pos, n)).Parse(fields).empty();
  });
}

std::uint64_t Nlohmann(const SharedTrace& t) {
  NlohmannLineParser parser;
  return EachLine(t.text, [&](std::size_t pos, std::size_t n, std::vector<Field>& fields) {
    return parser.Parse(std::string_view(t.text).substr(pos, n), fields);
  });
}

std::uint64_t Simdjson(const SharedTrace& t) {
  SimdjsonLineParser parser;
  const char* data = t.padded.data();
  const std::size_t allocated = t.padded.size() + simdjson::SIMDJSON_PADDING;
  return EachLine(std::string_view(data, t.padded.size()),
                  [&](std::size_t pos, std::size_t n, std::vector<Field>& fields) {
                    return parser.Parse(data + pos, n, allocated - pos, fields);
                  });
}

std::uint64_t SimdjsonDom(const SharedTrace& t) {
  SimdjsonDomLineParser parser;
  const char* data = t.padded.data();
  return EachLine(std::string_view(data, t.padded.size()),
                  [&](std::size_t pos, std::size_t n, std::vector<Field>& fields) {
                    return parser.Parse(data + pos, n, fields);
                  });
}

// One benchmark per (tokenizer, trace); Arg(i) is the i-th trace, Arg(-1) all five in turn.
template <std::uint64_t (*kTokenize)(const SharedTrace&)>
void BM_Tokenize(benchmark::State& state) {
  const std::vector<SharedTrace>& traces = Traces();
  if (traces.size() != 5) return state.SkipWithError("the five shared traces are missing (REMAT_SHARED_DIR)");
  std::vector<const SharedTrace*> chosen;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    if (state.range(0) < 0 || static_cast<std::size_t>(state.range(0)) == i) chosen.push_back(&traces[i]);
  }
  std::size_t bytes = 0;
  for (const SharedTrace* t : chosen) {
    // Every tokenizer must see the same fields as the hand-written one.
    if (kTokenize(*t) != Handwritten(*t) || Handwritten(*t) == 0) return state.SkipWithError("checksum differs");
    bytes += t->text.size();
  }
  for (auto _ : state) {
    for (const SharedTrace* t : chosen) benchmark::DoNotOptimize(kTokenize(*t));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(state.range(0) < 0 ? "all five" : chosen[0]->name);
}

void BM_ParseTrace(benchmark::State& state) {
  const std::vector<SharedTrace>& traces = Traces();
  if (traces.size() != 5) return state.SkipWithError("the five shared traces are missing (REMAT_SHARED_DIR)");
  std::size_t bytes = 0;
  std::vector<const SharedTrace*> chosen;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    if (state.range(0) < 0 || static_cast<std::size_t>(state.range(0)) == i) {
      chosen.push_back(&traces[i]);
      bytes += traces[i].text.size();
      if (!ParseTrace(traces[i].text, traces[i].name).ok()) return state.SkipWithError("ParseTrace failed");
    }
  }
  for (auto _ : state) {
    for (const SharedTrace* t : chosen) benchmark::DoNotOptimize(ParseTrace(t->text, t->name));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(state.range(0) < 0 ? "all five" : chosen[0]->name);
}

BENCHMARK(BM_Tokenize<Handwritten>)->Name("Handwritten")->DenseRange(-1, 4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Tokenize<Simdjson>)->Name("Simdjson")->DenseRange(-1, 4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Tokenize<SimdjsonDom>)->Name("SimdjsonDom")->DenseRange(-1, 4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Tokenize<Nlohmann>)->Name("Nlohmann")->DenseRange(-1, 4)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseTrace)->Name("ParseTrace")->DenseRange(-1, 4)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace remat

int main(int argc, char** argv) {
  benchmark::AddCustomContext("simdjson_dom_kernel", simdjson::get_active_implementation()->name());
  benchmark::AddCustomContext("simdjson_ondemand_kernel", simdjson::builtin_implementation()->name());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
