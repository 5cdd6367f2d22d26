// Op traits: what the dispatch hook needs to know about an op's schema (OpTraits, dispatch_hook.h), computed once per
// schema: Tensor arguments, which it writes (alias annotations), random (a Generator argument in some overload, or
// op_effects.h's list), views, and the writes schemas do not declare.
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "integration/op_capture.h"
#include "integration/op_effects.h"
#include "policies/costly_ops.h"

namespace remat::integration {
namespace {

bool IsGeneratorType(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

// Alias sets an argument or return belongs to, including those of list elements (`Tensor(a)[]`).
std::vector<c10::Symbol> AliasSets(const c10::Argument& argument, bool* writes) {
  std::vector<c10::Symbol> sets;
  *writes = false;
  const c10::AliasInfo* info = argument.alias_info();
  if (info == nullptr) return sets;
  auto add = [&](const c10::AliasInfo& a) {
    *writes = *writes || a.isWrite();
    for (const c10::Symbol& s : a.beforeSets()) {
      if (s != c10::AliasInfo::wildcardSet()) sets.push_back(s);
    }
  };
  add(*info);
  for (const c10::AliasInfo& contained : info->containedTypes()) add(contained);
  return sets;
}

// Base names ("aten::rand") of operators with a Generator argument in at least one overload, so that the
// overloads without one (aten::rand(size)) count as random too. Computed once.
const absl::flat_hash_set<std::string>& OpsWithAGeneratorOverload() {
  static const auto* names = [] {
    auto* set = new absl::flat_hash_set<std::string>();
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      std::optional<c10::OperatorHandle> handle = dispatcher.findOp(name);
      if (!handle || !handle->hasSchema()) continue;
      for (const c10::Argument& argument : handle->schema().arguments()) {
        if (IsGeneratorType(argument.type())) {
          set->insert(name.name);
          break;
        }
      }
    }
    return set;
  }();
  return *names;
}

std::unique_ptr<OpTraits> ComputeTraits(const c10::FunctionSchema& schema) {
  auto traits = std::make_unique<OpTraits>();
  traits->name = schema.overload_name().empty() ? schema.name() : absl::StrCat(schema.name(), ".", schema.overload_name());
  traits->tracked = !absl::StartsWith(schema.name(), "remat::");
  traits->replayable = !HasExternalEffects(schema.name());
  traits->uninitialized = ProducesUninitializedMemory(traits->name);
  traits->reads_float32_precision = IsCostlyOp(traits->name);
  const auto& arguments = schema.arguments();
  std::vector<std::vector<c10::Symbol>> argument_sets(arguments.size());
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    bool writes = false;
    argument_sets[i] = AliasSets(arguments[i], &writes);
    if (writes) {
      traits->written_arguments.push_back(static_cast<int>(i));
      traits->out_argument.push_back(arguments[i].kwarg_only());
    }
    if (traits->generator_argument < 0 && IsGeneratorType(arguments[i].type())) {
      traits->generator_argument = static_cast<int>(i);
    }
  }
  traits->random = traits->generator_argument >= 0 || OpsWithAGeneratorOverload().contains(schema.name()) ||
                   IsGeneratorlessRandomOp(schema.name());
  for (const c10::Argument& ret : schema.returns()) {
    bool writes = false;
    const std::vector<c10::Symbol> sets = AliasSets(ret, &writes);
    int aliased = -1;
    for (std::size_t i = 0; i < arguments.size() && aliased < 0 && !sets.empty(); ++i) {
      for (const c10::Symbol& s : sets) {
        if (std::find(argument_sets[i].begin(), argument_sets[i].end(), s) != argument_sets[i].end()) {
          aliased = static_cast<int>(i);
          break;
        }
      }
    }
    traits->return_aliases.push_back(aliased);
    if (aliased >= 0 && !writes) traits->is_view = true;
  }
  // A tensor written and not returned, beside fresh outputs: each call is checked (op_effects.h, 3 and 4).
  const bool fresh_output = std::find(traits->return_aliases.begin(), traits->return_aliases.end(), -1) !=
                            traits->return_aliases.end();
  bool writes_unreturned = false;
  for (const int w : traits->written_arguments) {
    writes_unreturned = writes_unreturned || std::find(traits->return_aliases.begin(), traits->return_aliases.end(),
                                                       w) == traits->return_aliases.end();
  }
  traits->writes_unreturned = fresh_output && writes_unreturned;
  return traits;
}

}  // namespace

std::mutex& TraitsMutex() {
  static std::mutex* mutex = new std::mutex();  // never destroyed: ops may run during static destruction
  return *mutex;
}

const OpTraits* SharedTraits(const c10::OperatorHandle& op) {
  std::mutex& mutex = TraitsMutex();
  static auto* traits = new absl::flat_hash_map<const c10::FunctionSchema*, std::unique_ptr<OpTraits>>();
  OpsWithAGeneratorOverload();  // the first call scans every registered operator: do it outside our lock
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<OpTraits>& slot = (*traits)[&op.schema()];
  if (slot == nullptr) slot = ComputeTraits(op.schema());
  return slot.get();
}

}  // namespace remat::integration
