// Trace recorder: see trace_recorder.h for the contract.
#include "integration/trace_recorder.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "integration/held_references.h"
#include "integration/op_cost.h"
#include "integration/op_capture.h"

namespace remat::integration {
namespace {

bool Recordable(const at::Tensor& tensor) {
  return tensor.defined() && StridedOverStorage(tensor);
}

std::size_t StorageBytes(const c10::StorageImpl& storage) {
  return storage.sym_nbytes().is_heap_allocated() ? 0 : storage.nbytes();
}

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

std::string QuotedList(const std::vector<std::string>& names) {
  return absl::StrCat("[", absl::StrJoin(names, ",", [](std::string* out, const std::string& n) {
                        absl::StrAppend(out, "\"", n, "\"");
                      }),
                      "]");
}

// Calls visit(argument_index, tensor) for every strided tensor among the arguments, lists flattened.
template <typename Visit>
void ForEachArgumentTensor(const c10::Stack& arguments, Visit visit) {
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = arguments[i];
    const int index = static_cast<int>(i);
    if (value.isTensor()) {
      if (Recordable(value.toTensor())) visit(index, value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList()) {
        if (Recordable(tensor)) visit(index, tensor);
      }
    } else if (value.isList()) {
      for (const c10::IValue& element : value.toList()) {
        if (element.isTensor() && Recordable(element.toTensor())) visit(index, element.toTensor());
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorder::Open(const std::string& path, bool estimated_costs,
                                                                   CountsAgainstBudget counts) {
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat("remat: cannot create the trace file ", path));
  out << "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"}\n";
  auto recorder = std::unique_ptr<TraceRecorder>(new TraceRecorder(path, std::move(out), estimated_costs));
  recorder->counts_ = std::move(counts);
  return recorder;
}

std::unique_ptr<TraceRecorder> TraceRecorder::InMemory(bool estimated_costs, CountsAgainstBudget counts) {
  auto recorder = std::unique_ptr<TraceRecorder>(new TraceRecorder("<memory>", std::ofstream(), estimated_costs));
  recorder->in_memory_ = true;
  recorder->counts_ = std::move(counts);
  recorder->stream_ = &recorder->memory_;
  *recorder->stream_ << "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"}\n";
  return recorder;
}

TraceRecorder::TraceRecorder(std::string path, std::ofstream out, bool estimated_costs)
    : path_(std::move(path)), out_(std::move(out)), stream_(&out_), estimated_costs_(estimated_costs) {}

std::string TraceRecorder::TakeText() {
  (void)Close();  // in memory: nothing can fail
  std::string text = std::move(memory_).str();
  memory_.str(std::string());
  return text;
}

TraceRecorder::~TraceRecorder() { (void)Close(); }

std::string TraceRecorder::NewName() { return absl::StrCat("t", next_name_++); }

void TraceRecorder::ReleaseDead() {
  for (auto it = known_.begin(); it != known_.end();) {
    if (DeadToTheUser(it->second.storage, it->first)) {
      for (const std::string& name : it->second.names) {
        *stream_ << "{\"INSTRUCTION\":\"RELEASE\",\"NAME\":" << Quoted(name) << "}\n";
      }
      known_.erase(it++);
    } else {
      ++it;
    }
  }
}

const std::string& TraceRecorder::NameOf(const at::Tensor& tensor) {
  return NameOfStorage(*tensor.storage().unsafeGetStorageImpl());
}

const std::string& TraceRecorder::NameOfStorage(c10::StorageImpl& storage) {
  auto [it, inserted] = known_.try_emplace(&storage);
  if (inserted) {
    it->second.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(
        c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(&storage));
    it->second.names.push_back(NewName());
    const std::string& name = it->second.names.front();
    *stream_ << "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":" << Quoted(name) << "}\n";
    const std::size_t bytes = BudgetedBytes(storage, StorageBytes(storage));
    *stream_ << "{\"INSTRUCTION\":\"MEMORY\",\"NAME\":" << Quoted(name) << ",\"MEMORY\":\"" << bytes << "\"}\n";
  }
  return it->second.names.front();
}

std::size_t TraceRecorder::BudgetedBytes(c10::StorageImpl& storage, std::size_t bytes) const {
  return counts_ == nullptr || counts_(storage) ? bytes : 0;
}

void TraceRecorder::Declare(c10::StorageImpl& storage) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!closed_) (void)NameOfStorage(storage);
  NoteWriteFailure();
}

void TraceRecorder::NoteWriteFailure() {
  if (write_failed_ || in_memory_ || *stream_) return;
  write_failed_ = true;
  write_errno_ = errno;
}

absl::Status TraceRecorder::WriteError(int error_number) const {
  return absl::DataLossError(absl::StrCat("remat: writing the trace ", path_, " failed (", std::strerror(error_number),
                                          "); the trace is incomplete"));
}

absl::Status TraceRecorder::WriteStatus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return write_failed_ ? WriteError(write_errno_) : absl::OkStatus();
}

void TraceRecorder::OnPinned(const c10::StorageImpl* storage) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  auto it = known_.find(storage);
  if (it == known_.end()) return;  // not in the trace yet: a CONSTANT when it first appears
  *stream_ << "{\"INSTRUCTION\":\"PIN\",\"NAME\":" << Quoted(it->second.names.front()) << "}\n";
  NoteWriteFailure();
}

void TraceRecorder::OnBlankOverwritten(const c10::StorageImpl* storage) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!closed_ && known_.contains(storage)) overwritten_.insert(storage);
}

void TraceRecorder::OnOp(const OpRecord& record) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  const absl::Cleanup note_failure = [this] { NoteWriteFailure(); };
  ReleaseDead();
  if (record.in_backward != in_backward_) {
    in_backward_ = record.in_backward;
    *stream_ << "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"" << (in_backward_ ? "BACKWARD" : "FORWARD") << "\"}\n";
  }

  std::vector<std::string> args;
  std::vector<const c10::StorageImpl*> arg_storages;
  std::vector<int> arg_of;  // argument index of each ARGS entry
  ForEachArgumentTensor(record.arguments, [&](int index, const at::Tensor& tensor) {
    args.push_back(NameOf(tensor));
    arg_storages.push_back(tensor.storage().unsafeGetStorageImpl());
    arg_of.push_back(index);
  });
  // Blank storages the engine bridge let this op overwrite entirely (OnBlankOverwritten): their old value is gone
  // and the op makes their new one, as the engine sees it: no longer arguments, fresh results (RELEASE first).
  std::vector<c10::StorageImpl*> blanks;
  if (!overwritten_.empty()) {
    for (std::size_t k = 0; k < args.size();) {
      if (!overwritten_.contains(arg_storages[k])) {
        ++k;
        continue;
      }
      c10::StorageImpl* blank = const_cast<c10::StorageImpl*>(arg_storages[k]);
      if (std::find(blanks.begin(), blanks.end(), blank) == blanks.end()) blanks.push_back(blank);
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(k));
      arg_storages.erase(arg_storages.begin() + static_cast<std::ptrdiff_t>(k));
      arg_of.erase(arg_of.begin() + static_cast<std::ptrdiff_t>(k));
    }
    overwritten_.clear();
    for (c10::StorageImpl* blank : blanks) {
      std::vector<std::string>& names = known_[blank].names;
      for (const std::string& old : names) *stream_ << "{\"INSTRUCTION\":\"RELEASE\",\"NAME\":" << Quoted(old) << "}\n";
      names.clear();
    }
  }
  // The engine's own cost (engine_bridge.cc AfterOp) when estimated.
  const std::int64_t cost =
      estimated_costs_ ? std::max<std::int64_t>(1, EstimatedCostNs(record)) : static_cast<std::int64_t>(record.duration_ns);
  const std::string time = absl::StrCat("\"", cost, "\"");
  const std::string name = Quoted(record.traits->name);

  bool fresh_outputs = !blanks.empty();
  for (const CapturedOutput& output : record.outputs) fresh_outputs = fresh_outputs || output.input_storage < 0;
  if (!record.traits->written_arguments.empty() && !fresh_outputs) {
    std::vector<std::string> mutated;
    for (std::size_t k = 0; k < args.size(); ++k) {
      for (int written : record.traits->written_arguments) {
        if (arg_of[k] == written) mutated.push_back(absl::StrCat(k));
      }
    }
    *stream_ << "{\"INSTRUCTION\":\"MUTATE\",\"NAME\":" << name << ",\"ARGS\":" << QuotedList(args) << ",\"MUTATE\":["
         << absl::StrJoin(mutated, ",") << "],\"TIME\":" << time << "}\n";
    ++ops_written_;
    return;
  }

  struct Result {
    std::string name;
    std::size_t bytes;
    int alias;
  };
  std::vector<Result> results;
  for (const CapturedOutput& output : record.outputs) {
    c10::intrusive_ptr<c10::StorageImpl> storage = output.storage.lock();
    if (!storage) continue;  // died before we looked: nothing to name
    if (output.input_storage >= 0 &&
        std::find(blanks.begin(), blanks.end(), record.input_storages[output.input_storage].get()) != blanks.end()) {
      continue;  // the overwritten blank itself: a fresh result below
    }
    // Memory the budget does not count (`counts`) is 0 bytes, as for constants.
    Result result{NewName(), BudgetedBytes(*storage, output.storage_nbytes), -1};
    if (output.input_storage >= 0) {
      const c10::StorageImpl* shared = record.input_storages[output.input_storage].get();
      for (std::size_t k = 0; k < arg_storages.size(); ++k) {
        if (arg_storages[k] == shared) {
          result.alias = static_cast<int>(k);
          break;
        }
      }
      std::size_t numel = 1;
      for (std::int64_t size : output.meta.sizes) numel *= static_cast<std::size_t>(size);
      result.bytes = numel * c10::elementSize(output.meta.dtype);
    }
    if (result.alias < 0) {
      auto [it, inserted] = known_.try_emplace(storage.get());
      if (inserted) it->second.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(storage);
      it->second.names.push_back(result.name);
    }
    results.push_back(std::move(result));
  }
  for (c10::StorageImpl* blank : blanks) {
    Result result{NewName(), BudgetedBytes(*blank, StorageBytes(*blank)), -1};
    known_[blank].names.push_back(result.name);
    results.push_back(std::move(result));
  }
  std::vector<std::string> result_names;
  for (const Result& r : results) result_names.push_back(r.name);
  *stream_ << "{\"INSTRUCTION\":\"CALL\",\"NAME\":" << name << ",\"ARGS\":" << QuotedList(args)
       << ",\"RESULT\":" << QuotedList(result_names) << ",\"TIME\":" << time << "}\n";
  for (const Result& r : results) {
    *stream_ << "{\"INSTRUCTION\":\"MEMORY\",\"NAME\":" << Quoted(r.name) << ",\"MEMORY\":\"" << r.bytes << "\"}\n";
    *stream_ << "{\"INSTRUCTION\":\"ALIAS\",\"NAME\":" << Quoted(r.name) << ",\"ALIAS\":\"" << r.alias << "\"}\n";
  }
  // A view's name is never an argument (arguments name storages), and its storage's own name keeps the storage
  // alive until it dies: the view's name goes at once, or views of a long-lived storage (a parameter's transpose,
  // made every step) would pile up as names referenced to the end.
  for (const Result& r : results) {
    if (r.alias >= 0) *stream_ << "{\"INSTRUCTION\":\"RELEASE\",\"NAME\":" << Quoted(r.name) << "}\n";
  }
  ++ops_written_;
}

absl::Status TraceRecorder::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return absl::OkStatus();
  closed_ = true;
  ReleaseDead();
  known_.clear();
  if (in_memory_) return absl::OkStatus();
  if (write_failed_) {
    out_.close();
    return WriteError(write_errno_);
  }
  out_.flush();
  bool ok = static_cast<bool>(out_);
  const int flush_errno = errno;
  out_.close();
  ok = ok && static_cast<bool>(out_);
  if (!ok) return WriteError(flush_errno != 0 ? flush_errno : errno);
  return absl::OkStatus();
}

std::uint64_t TraceRecorder::ops_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ops_written_;
}

}  // namespace remat::integration
