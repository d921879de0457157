// Asynchronous checkpointing: the training thread hands over its state and goes on; a copy thread
// snapshots it into a host buffer the writer owns and a writer thread writes that through a
// CheckpointStore.
//
// Submit() returns at once: the copy (a memcpy of every shard) runs on the copy thread while the
// training thread goes on with what only reads the state — the next step's forward and backward
// passes — and WaitForSnapshot() is the fence before the state changes again (the optimizer
// update): it returns once the copy is done, at once when it already is. The caller must not
// change the shards between Submit and WaitForSnapshot (Trainer::Step's before_update runs it).
// Buffers are reused: after the first few snapshots no memory is allocated. At most one write is
// in flight and at most one snapshot is queued behind it. When Submit finds a snapshot still
// queued (the disk is slower than the checkpoint interval):
//   kWait (default)  Submit first waits until the queued snapshot has started writing, so every
//                    submitted step is written and training slows to the disk's pace;
//   kSupersede       the new snapshot replaces the queued one, whose step is then never written
//                    (counted in stats().superseded); Submit never waits for the disk.
// Errors of a background write are returned by the next Submit() or Flush() (and cleared); that
// Submit queues nothing, so the caller sees exactly which snapshot was not taken.
//
// Threads: Submit, WaitForSnapshot, Flush and stats are called from one owner thread (the
// training thread); the writer thread is the only user of the store while the CheckpointWriter
// lives.
//
//   Submit ──copy thread──> [queued] ──writer thread──> [writing] ──> committed (LATEST moved)
//                              └── superseded (kSupersede, a newer Submit arrived first)
//
// Example:
//   CheckpointWriter writer(store.get());
//   auto fence = [&] { writer.WaitForSnapshot(); };
//   for (int64_t s = 0; s < steps; ++s) {
//     trainer.Step(fence);  // the snapshot is copied while this step's passes run
//     if (s % k == 0) RETURN_IF_ERROR(writer.Submit(meta_for(s), {{0, n, params, m, v}}));
//   }
//   RETURN_IF_ERROR(writer.Flush());
#ifndef TROUPE_TRAIN_CHECKPOINT_WRITER_H_
#define TROUPE_TRAIN_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "troupe/train/checkpoint_store.h"

namespace troupe::train {

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

  // Starts the snapshot of shards (as CheckpointStore::Write takes them) and queues the write of
  // meta.step; the shards must stay unchanged until WaitForSnapshot returns.
  [[nodiscard]] absl::Status Submit(const CheckpointManifest& meta,
                                    absl::Span<const ShardView> shards);
  // Returns once the last Submit's shards are copied: from then on the caller may change them.
  void WaitForSnapshot();
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
  void RunCopies();
  static void Copy(absl::Span<const ShardView> shards, Snapshot* out);

  CheckpointStore* const store_;
  const CheckpointWriterOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Snapshot> copying_ ABSL_GUARDED_BY(mu_);  // submitted, not copied yet
  std::vector<ShardView> copy_from_ ABSL_GUARDED_BY(mu_);   // the caller's shards it copies
  std::unique_ptr<Snapshot> queued_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Snapshot>> free_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  CheckpointWriterStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;       // writes
  std::thread copy_thread_;  // snapshots
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_CHECKPOINT_WRITER_H_
