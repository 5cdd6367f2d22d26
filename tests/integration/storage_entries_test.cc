// StorageEntries (integration/storage_entries.h): the two live lists, what each sweep visits, the moves between them.
#include "integration/storage_entries.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace remat::integration {
namespace {

using Entry = StorageEntries::Entry;

c10::intrusive_ptr<c10::StorageImpl> MakeStorage() {
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 64, c10::GetCPUAllocator(),
                                               /*resizable=*/false);
}

// Marks every entry it is shown released, and remembers their storages.
struct Releaser {
  std::vector<const c10::StorageImpl*> released;
  void operator()(Entry& entry) {
    entry.released = true;
    released.push_back(entry.key);
  }
};

// `n` fresh storages, each added to `entries` in order (the caller's references are their only users).
std::vector<c10::intrusive_ptr<c10::StorageImpl>> AddStorages(StorageEntries& entries, int n) {
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> storages;
  for (int i = 0; i < n; ++i) entries.Add(storages.emplace_back(MakeStorage()));
  return storages;
}

std::vector<const c10::StorageImpl*> LiveKeys(const StorageEntries& entries) {
  std::vector<const c10::StorageImpl*> keys;
  entries.ForEachLive([&](const Entry& entry) { keys.push_back(entry.key); });
  return keys;
}

TEST(StorageEntries, ADeadStorageNoRecordHoldsWaitsForTheUnheldSweep) {
  StorageEntries entries;
  auto storages = AddStorages(entries, 2);
  const c10::StorageImpl* dead = storages[0].get();
  storages[0].reset();  // its memory went with its last reference; only the entry's weak reference is left

  Releaser held_sweep;
  entries.SweepHeld(std::ref(held_sweep));
  EXPECT_TRUE(held_sweep.released.empty());
  EXPECT_EQ(LiveKeys(entries).size(), 2u);

  Releaser unheld_sweep;
  entries.SweepUnheld(std::ref(unheld_sweep));
  EXPECT_EQ(unheld_sweep.released, std::vector<const c10::StorageImpl*>{dead});
  EXPECT_EQ(LiveKeys(entries), std::vector<const c10::StorageImpl*>{storages[1].get()});
}

TEST(StorageEntries, AStorageOnlyRecordsHoldIsFoundByTheHeldSweep) {
  StorageEntries entries;
  auto a = MakeStorage();
  auto record_copy = a;  // a kept record's strong reference
  Entry& entry = entries.Add(a);
  entries.AddRecordRefs(entry, 1);
  a.reset();  // the user let go; the record still holds it

  Releaser held_sweep;
  entries.SweepHeld(std::ref(held_sweep));
  EXPECT_EQ(held_sweep.released, std::vector<const c10::StorageImpl*>{record_copy.get()});
  EXPECT_TRUE(LiveKeys(entries).empty());
}

TEST(StorageEntries, CrossingZeroRecordReferencesMovesAnEntryAndLeavesAHoleNoSweepReleases) {
  StorageEntries entries;
  auto a = MakeStorage();
  auto b = MakeStorage();
  auto c = MakeStorage();
  entries.Add(a);
  Entry& moved = entries.Add(b);
  entries.Add(c);
  auto b_record = b;  // a kept record's strong reference
  entries.AddRecordRefs(moved, 1);  // to the held list: a hole where it was
  EXPECT_EQ(LiveKeys(entries), (std::vector<const c10::StorageImpl*>{b.get(), a.get(), c.get()}));

  Releaser sweep;
  entries.SweepUnheld(std::ref(sweep));  // closes the hole, releases nothing
  entries.SweepHeld(std::ref(sweep));
  EXPECT_TRUE(sweep.released.empty());
  EXPECT_EQ(LiveKeys(entries), (std::vector<const c10::StorageImpl*>{b.get(), a.get(), c.get()}));

  b_record.reset();
  entries.AddRecordRefs(moved, -1);  // the record dropped: back to the end of the unheld list
  EXPECT_EQ(LiveKeys(entries), (std::vector<const c10::StorageImpl*>{a.get(), c.get(), b.get()}));
  entries.SweepHeld(std::ref(sweep));
  b.reset();
  entries.SweepHeld(std::ref(sweep));
  EXPECT_TRUE(sweep.released.empty());  // not the held list's any more
  entries.SweepUnheld(std::ref(sweep));
  EXPECT_EQ(sweep.released.size(), 1u);
  EXPECT_EQ(LiveKeys(entries), (std::vector<const c10::StorageImpl*>{a.get(), c.get()}));
}

TEST(StorageEntries, AnEntryNotReleasedStaysInItsPlace) {
  StorageEntries entries;
  auto storages = AddStorages(entries, 2);
  const c10::StorageImpl* first = storages[0].get();
  storages.clear();
  int shown = 0;
  entries.SweepUnheld([&](Entry& entry) {
    ++shown;
    if (entry.key != first) entry.released = true;  // the first stays (a kept constant, say)
  });
  EXPECT_EQ(shown, 2);
  EXPECT_EQ(LiveKeys(entries), std::vector<const c10::StorageImpl*>{first});
}

TEST(StorageEntries, ChangingRecordReferencesInsideASweepIsAnError) {
  StorageEntries entries;
  auto storages = AddStorages(entries, 2);
  Entry& other = *entries.Find(storages[1].get());
  storages[0].reset();
  EXPECT_THROW(entries.SweepUnheld([&](Entry& entry) {
    entry.released = true;
    entries.AddRecordRefs(other, 1);
  }),
               c10::Error);
}

}  // namespace
}  // namespace remat::integration
