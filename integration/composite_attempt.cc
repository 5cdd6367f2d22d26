// CompositeAttempt: see composite_attempt.h.
#include "integration/composite_attempt.h"

#include <algorithm>

namespace remat::integration {
namespace {

thread_local CompositeAttempt* t_attempt = nullptr;

}  // namespace

CompositeAttempt::CompositeAttempt(const CompositeArgumentStorages& arguments, bool repeatable_by_schema)
    : arguments_(arguments), enclosing_(t_attempt), repeatable_(repeatable_by_schema) {
  t_attempt = this;
}

CompositeAttempt::~CompositeAttempt() {
  t_attempt = enclosing_;
  if (!repeatable_ && enclosing_ != nullptr) enclosing_->repeatable_ = false;
}

bool CompositeAttempt::Owns(const c10::StorageImpl* storage) const {
  auto in = [storage](const auto& list) { return std::find(list.begin(), list.end(), storage) != list.end(); };
  return in(arguments_.read_raw) || in(arguments_.passed_on);
}

void CompositeAttempt::NoteRecordedOp(const OpRecord& record, bool under_python_mode) {
  CompositeAttempt* attempt = t_attempt;
  if (attempt == nullptr || !attempt->repeatable_) return;
  const OpTraits& traits = *record.traits;
  if (traits.random || under_python_mode || !record.replayable) {
    attempt->repeatable_ = false;
    return;
  }
  auto check_written = [&](int argument) {
    ForEachTensor(record.arguments[static_cast<std::size_t>(argument)], [&](const at::Tensor& t) {
      ForEachStorageRead(t, [&](c10::StorageImpl* storage) {
        for (CompositeAttempt* a = attempt; a != nullptr; a = a->enclosing_) {
          if (a->Owns(storage)) attempt->repeatable_ = false;
        }
      });
    });
  };
  for (int argument : traits.written_arguments) check_written(argument);
  for (int argument : record.unannotated_writes) check_written(argument);
}

void CompositeAttempt::NoteGeneratorMoved() {
  if (t_attempt != nullptr) t_attempt->repeatable_ = false;
}

}  // namespace remat::integration
