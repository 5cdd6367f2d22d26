#include "integration/op_in_flight.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <mutex>

#include "integration/engine_bridge_internal.h"
#include "integration/op_effects.h"

namespace remat::integration {

using bridge_internal::AddressOf;
using bridge_internal::ForEachTensor;

namespace {

// `t` reaches every byte of its storage, once.
bool CoversStorage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         static_cast<std::size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

// torch exposes the CPU generator's Mersenne Twister only by value (CPUGeneratorImpl::engine() and
// mt19937_engine::data() each copy its 2.5 KiB state): the fingerprint reads the few words it needs in place through
// pointers to the two private members, which an explicit instantiation may name (access checks do not apply there).
template <typename Tag, typename Tag::type Member>
struct PrivateMember {
  friend typename Tag::type MemberPointer(Tag) { return Member; }
};
struct GeneratorEngineTag {
  using type = at::mt19937 at::CPUGeneratorImpl::*;
  friend type MemberPointer(GeneratorEngineTag);
};
struct EngineDataTag {
  using type = at::mt19937_data_pod at::mt19937_engine::*;
  friend type MemberPointer(EngineDataTag);
};
template struct PrivateMember<GeneratorEngineTag, &at::CPUGeneratorImpl::engine_>;
template struct PrivateMember<EngineDataTag, &at::mt19937_engine::data_>;

}  // namespace

RngFingerprint DefaultCpuRngFingerprint() {
  // The default generator lives as long as the process (no reference taken: mutex() is not const).
  auto& generator = const_cast<at::Generator&>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(generator.mutex());
  auto* cpu = generator.get<at::CPUGeneratorImpl>();
  const at::mt19937_data_pod& data = (cpu->*MemberPointer(GeneratorEngineTag{})).*MemberPointer(EngineDataTag{});
  return RngFingerprint{data.seed_, data.left_, data.next_, data.state_.front(), data.state_.back(),
                        cpu->next_float_normal_sample(), cpu->next_double_normal_sample()};
}

void OpInFlight::NoteWrites(const OpRecord& record) {
  const OpTraits& traits = *record.traits;
  const std::size_t n = record.input_storages.size();
  inputs.assign(n, kNoIndex);
  written.assign(n, false);
  written_returned.assign(n, false);
  overwrite.assign(n, false);
  covered.assign(n, false);
  written_bytes.assign(n, 0);
  exports_inside.clear();
  // The schema's written arguments, then the writes it does not declare (never returned: written on the side).
  const std::size_t annotated = traits.written_arguments.size();
  for (std::size_t w = 0; w < annotated + record.unannotated_writes.size(); ++w) {
    const bool declared = w < annotated;
    const int a = declared ? traits.written_arguments[w] : record.unannotated_writes[w - annotated];
    const bool returned = declared && std::find(traits.return_aliases.begin(), traits.return_aliases.end(), a) !=
                                          traits.return_aliases.end();
    const bool overwrites =
        declared && (traits.out_argument[w] || (a == 0 && OverwritesSelf(record.op.schema().name())));
    ForEachTensor(record.arguments[a], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      for (std::size_t k = 0; k < n; ++k) {
        if (record.input_storages[k].get() != t.storage().unsafeGetStorageImpl()) continue;
        written[k] = true;
        written_returned[k] = written_returned[k] || returned;
        covered[k] = covered[k] || (overwrites && returned && CoversStorage(t));
      }
    });
  }
}

void OpInFlight::NoteWrittenSizes(const OpRecord& record) {
  for (std::size_t k = 0; k < written.size(); ++k) {
    if (written[k]) written_bytes[k] = static_cast<std::int64_t>(record.input_storages[k]->nbytes());
  }
}

namespace {

// The first non-CPU device among the op's tensor inputs, else among its Device arguments (a factory op's
// `device=`), else the CPU: the device whose default generator an op could draw from besides the CPU's. The cheap
// form of device_generator.h's OpDevice for every op: the input storages are at hand, and two devices need no error.
c10::Device WatchedDevice(const OpRecord& record) {
  for (const auto& storage : record.input_storages) {
    if (!storage->device().is_cpu()) return storage->device();
  }
  for (const c10::IValue& value : record.arguments) {
    if (value.isDevice() && !value.toDevice().is_cpu()) return value.toDevice();
  }
  return c10::Device(c10::DeviceType::CPU);
}

}  // namespace

void OpInFlight::WatchGenerator(const OpRecord& record) {
  check_rng = !record.traits->random && !record.rng.has_value() && record.replayable;
  device_rng_before.reset();
  if (!check_rng) return;
  rng_before = DefaultCpuRngFingerprint();
  rng_device = WatchedDevice(record);
  if (!rng_device.is_cpu()) device_rng_before = DefaultGeneratorPosition(rng_device);
}

bool OpInFlight::GeneratorMoved() const {
  if (!check_rng) return false;
  if (rng_before != DefaultCpuRngFingerprint()) return true;
  return device_rng_before.has_value() && DefaultGeneratorPosition(rng_device) != device_rng_before;
}

void OpInFlight::PlanOutputs(const OpRecord& record, const StorageEntries& entries) {
  const std::size_t n = record.input_storages.size();
  std::vector<int>& engine_position = plan.engine_position;
  engine_position.assign(n, -1);
  for (std::size_t k = 0, p = 0; k < n; ++k) {
    if (inputs[k] != kNoIndex) engine_position[k] = static_cast<int>(p++);
  }
  std::vector<OutputSpec>& specs = plan.specs;
  std::vector<int>& spec_output = plan.spec_output;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>>& spec_impl = plan.spec_impl;
  specs.clear();
  spec_output.clear();
  spec_impl.clear();
  for (std::size_t i = 0; i < record.outputs.size(); ++i) {
    const CapturedOutput& out = record.outputs[i];
    if (out.input_storage >= 0) continue;  // a view of an input (or an input written in place: below)
    c10::intrusive_ptr<c10::StorageImpl> impl = out.storage.lock();
    if (!impl || entries.Contains(impl.get())) continue;
    bool seen = false;
    for (const auto& s : spec_impl) seen = seen || s.get() == impl.get();
    if (seen) continue;  // a second view of a fresh storage
    OutputSpec spec;
    spec.bytes = static_cast<std::int64_t>(out.storage_nbytes);
    spec.address = AddressOf(*impl);
    specs.push_back(spec);
    spec_output.push_back(static_cast<int>(i));
    spec_impl.push_back(std::move(impl));
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (!overwrite[k]) continue;
    c10::StorageImpl& impl = *record.input_storages[k];
    OutputSpec spec;
    spec.bytes = static_cast<std::int64_t>(impl.nbytes());
    spec.address = AddressOf(impl);
    specs.push_back(spec);
    spec_output.push_back(-1 - static_cast<int>(k));
    spec_impl.push_back(record.input_storages[k]);
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (!written_returned[k] || engine_position[k] < 0) continue;
    OutputSpec spec;
    if (Resized(record, k)) {
      spec.bytes = static_cast<std::int64_t>(record.input_storages[k]->nbytes());
      spec.address = AddressOf(*record.input_storages[k]);
    } else {
      spec.in_place_of = engine_position[k];
    }
    specs.push_back(spec);
    spec_output.push_back(-1 - static_cast<int>(k));
    spec_impl.push_back(record.input_storages[k]);
  }
}

}  // namespace remat::integration
