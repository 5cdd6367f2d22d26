// Opaque calls: see opaque_call.h for the contract. Uses the hook's capture (op_capture.h) to build the op's record.
#include "integration/opaque_call.h"

#include <ATen/core/List.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <chrono>
#include <memory>
#include <utility>

#include "integration/dispatch_hook.h"
#include "integration/memory_events.h"
#include "integration/op_capture.h"

namespace remat::integration {

namespace {

struct OpaqueCall {
  OpaqueCall(c10::OperatorHandle handle, const OpTraits& traits) : record(std::move(handle), traits) {}
  OpRecord record;
  OpObserver* observer = nullptr;
  ObserverCall counted;  // the observer outlives the call (WaitForObserverCalls)
  MemoryEventScope history{kOpaqueCallOperator, /*op=*/true};
  // A call that cannot be replayed: its inputs as weak references, as it may free them (the record's strong ones
  // are dropped after BeforeOp).
  bool weak = false;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> inputs;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> written;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> read;
  std::chrono::steady_clock::time_point start;
};

// One slot per open call on this thread; nullptr for a call that is not recorded (nesting only).
thread_local std::vector<std::unique_ptr<OpaqueCall>> t_opaque_calls;

// The operator opaque calls are recorded as. Its schema is registered here, so that every binary that can
// record an opaque call has it; its kernel (for replays) by whoever can run the calls again.
TORCH_LIBRARY_FRAGMENT(remat, m) {
  m.def("compiled_graph(Tensor[] written, Tensor[] read, int graph, Tensor[] snapshot) -> Tensor[]");
}

const c10::OperatorHandle& OpaqueCallHandle() {
  static const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(kOpaqueCallOperator, "");
  return handle;
}

std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> WeakTensors(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> weak;
  weak.reserve(tensors.size());
  for (const at::Tensor& t : tensors) weak.emplace_back(t.getIntrusivePtr());
  return weak;
}

c10::List<at::Tensor> LiveTensors(const std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>>& weak) {
  c10::List<at::Tensor> list;
  for (const auto& w : weak) {
    if (c10::intrusive_ptr<c10::TensorImpl> impl = w.lock()) list.push_back(at::Tensor(std::move(impl)));
  }
  return list;
}

// Takes the innermost open call off this thread's stack (nullptr: it was not recorded).
std::unique_ptr<OpaqueCall> PopOpaqueCall() {
  TORCH_CHECK(!t_opaque_calls.empty(), "remat: an opaque call ended that was never begun on this thread");
  std::unique_ptr<OpaqueCall> call = std::move(t_opaque_calls.back());
  t_opaque_calls.pop_back();
  if (call != nullptr) LeaveRecordedOp();
  return call;
}

}  // namespace

void BeginOpaqueCall(const std::vector<at::Tensor>& written, const std::vector<at::Tensor>& read,
                     std::int64_t graph, const std::vector<at::Tensor>& snapshot) {
  if (InsideRecordedOp() || !HookEnabledOnThisThread() || GetObserver() == nullptr) {
    t_opaque_calls.push_back(nullptr);
    return;
  }
  const c10::OperatorHandle& handle = OpaqueCallHandle();
  auto call = std::make_unique<OpaqueCall>(handle, TraitsOf(handle));
  call->observer = GetObserver();  // read after `counted`: see ObserverCall
  if (call->observer == nullptr) {
    t_opaque_calls.push_back(nullptr);
    return;
  }
  OpRecord& record = call->record;
  // The call runs on real tensors even under a Python dispatch mode (AOTAutograd runs a graph's first call under
  // one that checks aliasing); a replay runs without the mode, which is gone by then.
  record.tls_keys.included_ =
      record.tls_keys.included_ - c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
  record.in_backward = torch::autograd::get_current_graph_task_id() != -1;
  record.replayable = graph >= 0 && snapshot.size() == written.size() && !record.in_backward;
  record.arguments.push_back(AliasValue(c10::List<at::Tensor>(written), &record.input_storages, &record.replayable));
  record.arguments.push_back(AliasValue(c10::List<at::Tensor>(read), &record.input_storages, &record.replayable));
  record.arguments.emplace_back(graph);
  record.arguments.push_back(AliasValue(c10::List<at::Tensor>(snapshot), &record.input_storages, &record.replayable));
  if (!written.empty()) record.unannotated_writes.push_back(0);  // written on the side: constants from now on
  // A graph may draw from the default generator of its device (inductor's dropout seeds): a replay draws from a
  // copy of its state now. A graph whose device has no generator to copy is not replayed.
  if (record.replayable) record.rng = CopyDefaultGenerator(record.arguments);
  if (!record.rng.has_value()) record.replayable = false;
  call->weak = !record.replayable;
  call->observer->BeforeOp(record);  // throws (out of memory bringing inputs back): nothing is open
  if (call->weak) {
    for (const auto& storage : record.input_storages) call->inputs.emplace_back(storage);
    call->written = WeakTensors(written);
    call->read = WeakTensors(read);
    record.arguments.clear();
    for (auto& storage : record.input_storages) storage.reset();
  }
  EnterRecordedOp();
  call->start = std::chrono::steady_clock::now();
  t_opaque_calls.push_back(std::move(call));
}

void EndOpaqueCall(const std::vector<at::Tensor>& outputs) {
  std::unique_ptr<OpaqueCall> call = PopOpaqueCall();
  if (call == nullptr) return;
  OpRecord& record = call->record;
  record.duration_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - call->start).count());
  if (call->weak) {  // inputs still alive again, for aliasing (an output that is an input) and the trace's names
    for (std::size_t k = 0; k < call->inputs.size(); ++k) record.input_storages[k] = call->inputs[k].lock();
    record.arguments.push_back(LiveTensors(call->written));
    record.arguments.push_back(LiveTensors(call->read));
    record.arguments.emplace_back(static_cast<std::int64_t>(-1));
    record.arguments.push_back(c10::List<at::Tensor>());
  }
  c10::Stack returned;
  returned.emplace_back(c10::List<at::Tensor>(outputs));
  CaptureOutputs(record, returned);
  call->observer->AfterOp(std::move(record));
}

void OpaqueCallFailed() noexcept {
  if (t_opaque_calls.empty()) return;
  std::unique_ptr<OpaqueCall> call = PopOpaqueCall();
  if (call != nullptr) call->observer->OpFailed(call->record);
}

}  // namespace remat::integration
