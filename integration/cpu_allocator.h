// CPU allocator: torch's CPU allocator over a remat::Arena of host memory, with the budget as a hard limit
// (DESIGN.md, "PyTorch integration": CPU).
//
// InstallCpuArena(budget) reserves one segment of `budget` bytes from the host provider (mmap'ed with
// MAP_NORESERVE, so untouched pages cost nothing), and makes it c10's CPU allocator. Every block is 64-byte
// aligned; a DataPtr's context is its data pointer, so torch's raw_allocate/raw_deleter work. A request that
// does not fit calls the arena's pressure handler (the runtime, once it plugs in); if that cannot make room the
// allocation throws c10::OutOfMemoryError (torch.OutOfMemoryError in Python) naming the request, the budget, what
// is allocated, the free bytes and the largest hole.
//
// UninstallCpuArena gives c10 back the allocator that was installed before. Memory keeps being freed by the
// deleter of whoever allocated it: tensors made before the install go back to torch's allocator, tensors made
// under the arena go back to the arena, which therefore lives on, retired, until its last block is freed.
// The c10::Allocator object itself is never destroyed (StorageImpls keep a pointer to it for resize); once
// uninstalled it forwards new requests to the previous allocator.
//
// c10's SetAllocator ignores a request whose priority is below the installed one's. We install at exactly the
// current priority (found by trying 0, 1, ... until the set takes effect) and uninstall at the same one, so c10's
// priority state is unchanged after an install/uninstall pair.
//
// Thread safety: allocation and deallocation are safe from any thread (autograd's engine frees on its own).
// Install, uninstall and the setters must not race with each other (c10's SetAllocator is not thread safe
// either); the Python layer serializes them.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"

namespace remat::integration {

inline constexpr std::size_t kCpuAlignment = 64;

struct CpuArenaStats {
  bool installed = false;              // false: these are the numbers of the last arena, when it was uninstalled
  std::size_t budget = 0;              // the arena's capacity: the hard limit
  std::size_t allocated_bytes = 0;     // bytes in allocated blocks (64-byte multiples)
  std::size_t peak_allocated_bytes = 0;
  std::size_t reserved_bytes = 0;      // bytes reserved from the host provider
  std::size_t free_bytes = 0;
  std::size_t largest_free_block = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t pressure_allocations = 0;  // allocations that needed the pressure handler
  std::uint64_t failed_allocations = 0;    // allocations that raised OutOfMemoryError
  std::uint64_t search_ns = 0;
  // Stitching arena only (else 0): the granule, and the bytes of granules in use now and at the peak.
  std::size_t granule = 0;
  std::size_t physical_bytes = 0;
  std::size_t peak_physical_bytes = 0;
};

// AlreadyExists when an arena is installed; InvalidArgument for a zero budget; the provider's error when the
// segment cannot be reserved; FailedPrecondition when c10 refuses the allocator.
// `stitch_granule` > 0: a stitching arena (issue 18; allocator/arena.h ArenaOptions::granule): eight times the
// budget of address space, and a memfd pool of `budget` bytes mapped in granules of this many bytes (a power of two
// and a page multiple; InvalidArgument otherwise): the budget counts mapped granules, so a request needs free
// granules, not a hole.
absl::Status InstallCpuArena(std::size_t budget, std::size_t stitch_granule = 0);
// FailedPrecondition when no arena is installed.
absl::Status UninstallCpuArena();
bool CpuArenaInstalled();
// A reference that keeps the installed arena alive after UninstallCpuArena until the last copy goes, without a
// block of its memory (so it works when the arena has no free byte left): for whoever reads the arena while remat
// retires (the engine's statistics). Null when no arena is installed.
std::shared_ptr<void> RetainCpuArena();

// Stats of the installed arena, else the last ones recorded at uninstall (installed == false), else NotFound.
absl::StatusOr<CpuArenaStats> GetCpuArenaStats();
// Restarts the installed arena's peak at the current allocation. FailedPrecondition when none is installed.
absl::Status ResetCpuArenaPeak();

// The hook through which the runtime makes room: given to the installed arena (and to every arena installed
// later) until replaced; retired arenas lose theirs. nullptr: allocations that do not fit fail at once. Returns
// once no call into the previous handler is in flight in any arena. Not owned.
void SetCpuPressureHandler(PressureHandler* handler);

// fork(): the allocator's part of the process's fork handlers (engine_session.cc installs them). The child gets
// torch's own allocator for new tensors; tensors it inherited from an arena stay readable, and freeing one leaves
// the child's copy of the arena untouched (its locks may have been held by parent threads that are gone).
void CpuArenaPrepareFork();
void CpuArenaParentAfterFork();
void CpuArenaChildAfterFork();
// True in a forked child: no arena may be touched there (CpuDeviceMemory then has none).
bool InForkedChildOfCpuArena();

// Which end of a free block this thread's next CPU allocations take (Coop's cheap-tensor partitioning: the
// runtime sets kLow around costly ops). Default kLow.
void SetCpuPlacementForThisThread(Placement placement);

// While an engine manages the arena, the blocks allocated outside the ops it sees (a random generator's saved
// state, which torch.utils.checkpoint keeps per block until backward; buffers C++ code makes without the
// dispatcher; ops of a thread remat does not follow) are unknown to it: never evicted or moved, so wherever they
// land they split the free space it could join. `inside_op` answers whether the calling thread runs an op remat
// records; when it says no, the block goes to the top of the arena (Placement::kTop: the highest hole that holds
// it, at that hole's high end). Blocks remat does know of, made on a thread with no recorded op running, go there
// too (an intra-op worker's buffers during an op, a result brought back for numpy between ops): short-lived or
// movable, they do as well at the top. nullptr (the default): every block as SetCpuPlacementForThisThread says.
void SetCpuOutsideOpsProbe(bool (*inside_op)());

// A block of the installed arena placed as `placement` says, without asking the pressure handler (the runtime
// moving memory while it makes room); an empty DataPtr (get() == nullptr) when nothing fits or no arena is
// installed. `bytes` > 0.
c10::DataPtr TryAllocateInCpuArena(std::size_t bytes, Placement placement);

// Moves the installed arena's block that `storage` holds to `to`, inside the range the block would free
// (Arena::Move: into the hole next to it), with its bytes, and points the storage there: nothing is allocated or
// freed, and views and saved tensors follow. FailedPrecondition when the storage's memory is not a block of the
// installed arena; the arena's InvalidArgument when `to` is out of range (nothing changes then). The caller makes
// sure no kernel is using the storage.
absl::Status SlideInCpuArena(c10::StorageImpl& storage, std::uintptr_t to);

// The installed arena's blocks in address order (empty when none is installed), read under the registry lock so the
// arena cannot be retired meanwhile: for memory snapshots (memory_events.h).
std::vector<BlockInfo> CpuArenaBlocks();

// The installed arena, for the runtime (SetOwner, FindWindow, Free of evicted blocks); nullptr when none.
// Valid until UninstallCpuArena.
Arena* InstalledCpuArena();

// True when `data` is a block of a remat CPU arena (installed or retired): memory remat owns and may evict.
// Memory from torch's own allocator (also when remat forwarded the request to it), numpy or from_blob is not.
bool AllocatedByRematArena(const c10::DataPtr& data);

// True when `data` is host memory torch borrowed (DeviceMemory::Borrowed): not from remat's allocator (arena blocks
// and forwarded requests), nor from the CPU allocator remat replaced, nor torch's shared memory (at::MapAllocator,
// at::RefcountedMapAllocator), nor a slice of a storage that is none of these (see LearnStorageSliceDeleter). An
// empty DataPtr is not borrowed.
bool BorrowedCpuMemory(const c10::DataPtr& data);

// Teaches BorrowedCpuMemory the deleter of a storage slice (torch.UntypedStorage.__getitem__ with a slice: a
// StorageImpl over part of another's bytes, whose DataPtr's context is that parent StorageImpl). torch.load(mmap=True)
// and safetensors give every tensor such a slice of one mapped file, so without it the weights of a model loaded
// that way count as borrowed and no op reading them is replayed. `slice` is any such DataPtr (the Python package
// makes one at import); the deleter is a lambda inside torch_python, so it cannot be named from C++.
void LearnStorageSliceDeleter(const c10::DataPtr& slice);

// Arenas not yet deleted: the installed one and retired ones that still hold tensors.
std::size_t LiveCpuArenaCount();

// The c10::Allocator remat installs (static lifetime). Exposed for tests and for the runtime's own buffers.
c10::Allocator* RematCpuAllocator();

}  // namespace remat::integration
