// Trace: an operator log in the DTR prototype's JSON-lines format (../shared/traces/dtr/README.md), parsed once.
//
// Contract:
//   - ReadTrace/ParseTrace return the instructions after the `ANNOTATE START` line (everything before it is
//     checked for well-formedness and skipped; a file without START is replayed from its first line).
//   - Names are interned: every distinct trace name gets a dense id (`Trace::names[id]` is the original text).
//   - A CALL's per-result MEMORY and ALIAS lines, and a CONSTANT's MEMORY line, are folded into the
//     instruction; they never appear as instructions of their own.
//   - Errors are values: a malformed JSON line, an unknown INSTRUCTION, a missing field, a CONSTANT or CALL
//     result without its MEMORY (or ALIAS) line, a name in ARGS/SRC that was never defined, an ALIAS or MUTATE
//     index out of range all give InvalidArgument (NotFound when the file cannot be opened) whose message is
//     "<path>:<line>: <reason>". Nothing throws or crashes on bad input.
//   - RELEASE of a name that was never defined is kept (the replay ignores it, as the README says).
//   - remat's extensions, written by remat.record (integration/trace_recorder.h) and ignored by the DTR-paper
//     replay: `{"INSTRUCTION":"PIN","NAME":n}` says the PyTorch path pinned n's storage at that point (a result it
//     cannot replay, optimizer state, what a write to a constant would change; the name must be defined), and
//     `ANNOTATE FORWARD` ends the backward pass an `ANNOTATE BACKWARD` began (the optimizer step after it is not
//     part of it). The prototype's traces have neither; for them everything after BACKWARD is the backward pass.
//   - The Trace is immutable after parsing and may be replayed by many threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace remat {

using TraceName = std::int32_t;  // dense id of a trace name, index into Trace::names

enum class TraceOpKind : std::uint8_t {
  kConstant,  // `name` = the constant; bytes = its MEMORY
  kCall,      // op_name, args, results (with bytes and alias each), time_ns
  kMutate,    // op_name, args, mutated (indices into args), time_ns
  kCopy,      // dst = results[0], src = args[0]: one more reference to the same tensor
  kCopyFrom,  // dst = results[0], src = args[0]: the existing name dst now refers to src's tensor
  kRelease,   // args[0]: drop one external reference
  kAnnotate,  // op_name = the annotation (BACKWARD, FORWARD: see the contract)
  kPin,       // args[0]: remat's extension, the PyTorch path pinned this tensor here (see the contract)
};

struct TraceResult {
  TraceName name = -1;
  std::int64_t bytes = 0;  // the MEMORY line; for a view, the view's reported size (a view adds no bytes)
  std::int32_t alias = -1;  // -1: fresh storage; k: shares the storage of args[k]
};

struct TraceOp {
  TraceOpKind kind = TraceOpKind::kCall;
  std::int32_t line = 0;           // 1-based line number in the file, for messages
  std::string op_name;             // aten op name (CALL, MUTATE) or annotation text (ANNOTATE)
  std::int64_t time_ns = 0;        // CALL, MUTATE
  std::int64_t bytes = 0;          // CONSTANT
  TraceName name = -1;             // CONSTANT: the constant's name
  std::vector<TraceName> args;     // CALL, MUTATE; COPY/COPY_FROM: {src}; RELEASE: {name}
  std::vector<TraceResult> results;  // CALL; COPY/COPY_FROM: {dst} (bytes/alias unused)
  std::vector<std::int32_t> mutated;  // MUTATE: indices into args
};

struct Trace {
  std::string path;                 // as given to ReadTrace ("<memory>" for ParseTrace unless named)
  std::vector<std::string> names;   // TraceName -> original text
  std::vector<TraceOp> ops;         // instructions after START, in file order
  std::int64_t call_count = 0;      // CALL + MUTATE instructions
  std::int64_t total_time_ns = 0;   // summed TIME of CALL + MUTATE (the unconstrained compute)
};

// Reads and parses a trace file. Errors name the file, the line and the reason.
absl::StatusOr<Trace> ReadTrace(const std::string& path);

// Parses trace text already in memory; `path` is only used in messages and copied into Trace::path.
absl::StatusOr<Trace> ParseTrace(std::string_view text, std::string path = "<memory>");

}  // namespace remat
