// LinkModel: the timeline of the link between the device and the second tier (PagingOptions): when each copy the
// engine issues starts and ends. One FIFO link by default (a page-in queues behind earlier page-outs); duplex: one
// link per direction (a page-in waits only for earlier page-ins and for its own page-out, via `not_before`).
// Times are the engine's clock (ns of modelled compute); the model never sleeps, it only says when.
#pragma once

#include <cstdint>

namespace remat {

struct PagingOptions;

class LinkModel {
 public:
  explicit LinkModel(const PagingOptions& options);

  // Link time of one copy of `bytes`: latency + bytes / bandwidth (saturated, never overflowing, for a link of no
  // bandwidth).
  std::int64_t TransferNs(std::int64_t bytes) const;
  // Starts a copy (`in`: host to device) at the latest of `now`, its direction's free time and `not_before`;
  // returns when it ends (its direction is busy until then).
  std::int64_t Issue(std::int64_t bytes, bool in, std::int64_t now, std::int64_t not_before);
  // When the device-to-host direction (the only one, without duplex) finishes the copies issued so far.
  std::int64_t OutFreeAt() const { return out_free_; }
  // When both directions are done: what a new copy may queue behind.
  std::int64_t BusyUntil() const { return out_free_ > in_free_ ? out_free_ : in_free_; }

 private:
  double bandwidth_bytes_per_s_;
  std::int64_t latency_ns_;
  bool duplex_;
  std::int64_t out_free_ = 0;  // the link (duplex: its device-to-host direction)
  std::int64_t in_free_ = 0;   // duplex: the host-to-device direction
};

}  // namespace remat
