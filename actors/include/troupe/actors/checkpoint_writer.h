// Asynchronous checkpointing: the training thread hands over a snapshot and goes on; a background
// thread writes it through a CheckpointStore.
//
// Submit() copies the shards into a host buffer the writer owns (a memcpy; buffers are reused, so
// after the first two snapshots no memory is allocated) and queues it. At most one write is in
// flight and at most one snapshot is queued behind it. When Submit finds a snapshot still queued
// (the disk is slower than the checkpoint interval):
//   kWait (default)  Submit first waits until the queued snapshot has started writing, so every
//                    submitted step is written and training slows to the disk's pace;
//   kSupersede       the new snapshot replaces the queued one, whose step is then never written
//                    (counted in stats().superseded); Submit never waits for the disk.
// Errors of a background write are returned by the next Submit() or Flush() (and cleared); that
// Submit queues nothing, so the caller sees exactly which snapshot was not taken.
//
// Threads: Submit, Flush and stats are called from one owner thread (the training thread); the
// writer thread is the only user of the store while the CheckpointWriter lives.
//
//   Submit ──copy──> [queued] ──writer thread──> [writing] ──> committed (LATEST moved)
//                        └── superseded (kSupersede, a newer Submit arrived first)
//
// Example:
//   CheckpointWriter writer(store.get());
//   for (int64_t s = 0; s < steps; ++s) {
//     trainer.Step();
//     if (s % k == 0) RETURN_IF_ERROR(writer.Submit(meta_for(s), {{0, n, params, m, v}}));
//   }
//   RETURN_IF_ERROR(writer.Flush());
#ifndef TROUPE_ACTORS_CHECKPOINT_WRITER_H_
#define TROUPE_ACTORS_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "troupe/actors/checkpoint_store.h"

namespace troupe::actors {

struct CheckpointWriterOptions {
  enum class WhenBusy { kWait, kSupersede };
  WhenBusy when_busy = WhenBusy::kWait;
};

struct CheckpointWriterStats {
  int64_t submitted = 0;
  int64_t written = 0;
  int64_t superseded = 0;
  int64_t failed = 0;
  int64_t last_written_step = -1;
  double write_seconds = 0;  // background time spent in CheckpointStore::Write
  double wait_seconds = 0;   // time Submit spent waiting for a queued snapshot (kWait)
};

class CheckpointWriter {
 public:
  // store must outlive the writer.
  explicit CheckpointWriter(CheckpointStore* store, CheckpointWriterOptions options = {});
  ~CheckpointWriter();  // finishes the queued and in-flight writes, then stops the thread
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Snapshots shards (as CheckpointStore::Write takes them) and queues the write of meta.step.
  [[nodiscard]] absl::Status Submit(const CheckpointManifest& meta,
                                    absl::Span<const ShardView> shards);
  // Waits until nothing is queued or being written; returns the first error since the last call.
  [[nodiscard]] absl::Status Flush();
  CheckpointWriterStats stats() const;

 private:
  struct Snapshot {
    CheckpointManifest meta;
    std::vector<ShardView> views;  // point into data
    std::vector<float> data;
  };

  void Run();
  void Copy(const CheckpointManifest& meta, absl::Span<const ShardView> shards, Snapshot* out);

  CheckpointStore* const store_;
  const CheckpointWriterOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Snapshot> queued_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Snapshot>> free_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  CheckpointWriterStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_CHECKPOINT_WRITER_H_
