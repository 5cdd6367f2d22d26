// Hidden copies: see hidden_copies.h.
#include "integration/hidden_copies.h"

#include <algorithm>
#include <utility>

#include "integration/op_capture.h"

namespace remat::integration {
namespace {

thread_local OpRecord* t_watched = nullptr;

}  // namespace

bool WatchesCopies(const OpTraits& traits, const torch::jit::Stack& stack, std::size_t first_argument) {
  if (traits.written_arguments.empty() || !c10::GradMode::is_enabled()) return false;
  for (std::size_t i = first_argument; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().requires_grad()) return true;
  }
  return false;
}

CopyWatch::CopyWatch(OpRecord* record) : outer_(t_watched) { t_watched = record; }
CopyWatch::~CopyWatch() { t_watched = outer_; }

OpRecord* WatchedOp() { return t_watched; }

int WrittenInputCloned(const OpRecord& record, const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  static const c10::OperatorName kClone("aten::clone", "");
  // aten::clone(Tensor self, *, MemoryFormat? memory_format=None)
  if (op.operator_name() != kClone || stack.size() < 2 || !stack[stack.size() - 2].isTensor()) return -1;
  const at::Tensor& self = stack[stack.size() - 2].toTensor();
  if (!IsPlain(self)) return -1;
  const c10::StorageImpl* impl = self.storage().unsafeGetStorageImpl();
  for (const int a : record.traits->written_arguments) {
    const c10::IValue& argument = record.arguments[a];
    if (!argument.isTensor() || !IsPlain(argument.toTensor()) ||
        argument.toTensor().storage().unsafeGetStorageImpl() != impl) {
      continue;
    }
    for (std::size_t i = 0; i < record.input_storages.size(); ++i) {
      if (record.input_storages[i].get() == impl) return static_cast<int>(i);
    }
  }
  return -1;
}

void KeepCopy(OpRecord& record, int input_storage, const at::Tensor& self, const at::Tensor& copy) {
  if (!IsPlain(copy)) return;
  const c10::StorageImpl& source = *self.storage().unsafeGetStorageImpl();
  OpRecord::HiddenCopy hidden;
  hidden.input_storage = input_storage;
  hidden.copy = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(copy.storage().unsafeGetStorageImpl());
  // The copy's bytes are the storage's bytes when both start at 0 with the same strides and the input covers its
  // whole storage densely.
  hidden.whole_storage = self.storage_offset() == 0 && copy.storage_offset() == 0 && self.strides() == copy.strides() &&
                         self.is_non_overlapping_and_dense() && !source.sym_nbytes().is_heap_allocated() &&
                         !hidden.copy->sym_nbytes().is_heap_allocated() && source.nbytes() == hidden.copy->nbytes() &&
                         static_cast<std::size_t>(self.numel()) * self.itemsize() == source.nbytes();
  record.hidden_copies.push_back(std::move(hidden));
}

void KeepEscapedCopies(OpRecord& record) {
  auto temporary = [&](const OpRecord::HiddenCopy& hidden) {
    if (hidden.copy.use_count() <= 1) return true;  // only this record held it
    return std::any_of(record.outputs.begin(), record.outputs.end(), [&](const CapturedOutput& output) {
      return output.storage._unsafe_get_target() == hidden.copy.get();
    });
  };
  record.hidden_copies.erase(std::remove_if(record.hidden_copies.begin(), record.hidden_copies.end(), temporary),
                             record.hidden_copies.end());
}

}  // namespace remat::integration
