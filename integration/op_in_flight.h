// OpInFlight: what the bridge knows of the op between its BeforeOp and its AfterOp or OpFailed (engine_bridge.h, "Per
// op"): per input storage, whether the op writes it, returns it written, overwrites all of it (a blank constant it
// replaces), its engine tensor and its entry; the default CPU generator before the op; and, in AfterOp, the plan of
// what EndOp registers. One per bridge, reused by every op (the lock serializes them): its vectors keep their
// capacity, no allocation per op.
//
// Contract: NoteWrites starts an op (sizes every per-input vector to record.input_storages, all flags clear, no
// engine inputs); the bridge fills engine inputs and entries (GatherEngineInputs); PlanOutputs reads those and the
// op's outputs. GeneratorMoved is true only if WatchGenerator saw the generator before the op and it has changed.
#pragma once

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "integration/device_generator.h"
#include "integration/dispatch_hook.h"
#include "integration/storage_entries.h"
#include "runtime/engine.h"

namespace remat::integration {

// What changes whenever the default CPU generator draws: its counters, the first and last words of its state (all
// of which a twist every 624 draws rewrites) and its cached normal samples. Comparing it before and after an op
// that is not known to be random tells whether the op drew (then it cannot be replayed), for a few words instead
// of the generator's 2.5 KiB state.
struct RngFingerprint {
  std::uint64_t seed = 0;
  int left = 0;
  std::uint32_t next = 0;
  std::uint32_t first_word = 0;
  std::uint32_t last_word = 0;
  std::optional<float> float_normal;
  std::optional<double> double_normal;
  bool operator==(const RngFingerprint&) const = default;
};

// The default CPU generator's fingerprint now.
RngFingerprint DefaultCpuRngFingerprint();

// AfterOp's plan of what EndOp registers: per spec, index into record.outputs (>= 0) or -1 - k for input k
// (written in place, or a blank storage overwritten), and the StorageImpl holding it. Kept between ops so that
// its vectors keep their capacity (no allocation per op).
struct OutputPlan {
  std::vector<OutputSpec> specs;
  std::vector<int> spec_output;
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> spec_impl;
  std::vector<int> engine_position;  // per input storage: its position among the engine inputs, or -1
  std::vector<TensorId> out_tensors;  // EndOp's outputs, per spec
  // The kept record's ReplayOp::output_storage and ReplayOp::in_place, gathered before it is made.
  std::vector<StorageIndex> output_storage;
  std::vector<std::pair<int, StorageIndex>> in_place;
};

struct OpInFlight {
  bool active = false;
  OpId op = 0;
  std::vector<TensorId> inputs;  // per record.input_storages, kNoIndex when not an engine input
  // Flags per record.input_storages, one byte each (std::vector<bool>'s bit fills cost more per op).
  std::vector<std::uint8_t> written;
  std::vector<std::uint8_t> written_returned;
  std::vector<std::uint8_t> overwrite;  // a blank storage this op overwrites entirely
  std::vector<std::uint8_t> covered;    // the op overwrites all of it (NoteWrites)
  // Per input storage the op writes: its size before the kernel, inputs resident (NoteWrittenSizes), to see a
  // resize (an out= argument of another shape, resize_): the kernel gave the StorageImpl other memory of another size.
  std::vector<std::int64_t> written_bytes;
  std::vector<TensorId> engine_inputs;  // GatherEngineInputs' result
  std::vector<StorageEntries::Entry*> input_entries;  // per record.input_storages: its entry (stable addresses)
  std::vector<StorageIndex> written_constants;  // GatherEngineInputs: constants this op writes
  std::vector<TensorId> side_held;  // constants written on the side, held while the kernel runs (not engine inputs)
  // Ops not known to be random: the default CPU generator's state before the op (WatchGenerator). If the op
  // moved it (a composite such as aten::lstm with dropout), a replay would not reproduce it: its outputs become
  // constants.
  bool check_rng = false;
  RngFingerprint rng_before{};
  // The same for the default generator of the device an op on a non-CPU device runs on (CUDA's Philox offset):
  // that device, and its generator's position before the op (nullopt: none to watch).
  c10::Device rng_device = c10::Device(c10::DeviceType::CPU);
  std::optional<GeneratorPosition> device_rng_before;
  OutputPlan plan;
  // Exports (EngineBridge::MakeResident, StorageWillChange) that code inside the op's kernel took of the op's own
  // storages, such as a Python dispatch mode's handler reading untyped_storage(): applied once the op has ended.
  enum class Export : std::uint8_t { kRead, kWritable, kWillChange };
  std::vector<std::pair<c10::intrusive_ptr<c10::StorageImpl>, Export>> exports_inside;

  // What the op writes (op_effects.h): per input storage, written, written and returned, and whether the op
  // overwrites all of it (covered: a fill or out= argument covering the storage). Resets the rest for the op.
  void NoteWrites(const OpRecord& record);
  // The sizes of the storages the op writes, once its inputs are resident (an evicted storage's size reads 0) and
  // before its kernel runs.
  void NoteWrittenSizes(const OpRecord& record);
  // After the kernel: input storage k was written in place (not a blank it overwrote, which is a fresh value anyway)
  // and its size changed (see written_bytes). Its new value is a fresh value of the new size (PlanOutputs), kept as a
  // constant: a replay would have to resize again.
  bool Resized(const OpRecord& record, std::size_t k) const {
    return written[k] && !overwrite[k] &&
           static_cast<std::int64_t>(record.input_storages[k]->nbytes()) != written_bytes[k];
  }
  // An op whose generator state was captured (random ops, opaque calls) replays with it; any other replayable op
  // is watched: if it moves the default generator it is not replayable.
  void WatchGenerator(const OpRecord& record);
  bool GeneratorMoved() const;
  // Fills plan: the op's fresh output storages (not tracked in `entries` yet), the blank storages it overwrote
  // (fresh values in old StorageImpls) and its in-place writes of engine inputs, each with the StorageImpl that
  // holds it; an engine input the op resized is a fresh value (its size and address now), not an in-place one.
  void PlanOutputs(const OpRecord& record, const StorageEntries& entries);
};

}  // namespace remat::integration
