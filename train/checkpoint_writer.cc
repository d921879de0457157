#include "troupe/train/checkpoint_writer.h"

#include <chrono>
#include <cstring>

namespace troupe::train {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointStore* store, CheckpointWriterOptions options)
    : store_(store), options_(options) {
  thread_ = std::thread([this] { Run(); });
  copy_thread_ = std::thread([this] { RunCopies(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  copy_thread_.join();  // first: a snapshot it copies still reaches the queue
  thread_.join();
}

void CheckpointWriter::Copy(absl::Span<const ShardView> shards, Snapshot* out) {
  size_t total = 0;
  for (const ShardView& s : shards) {
    const size_t sections = 1 + (s.adam_m != nullptr) + (s.adam_v != nullptr);
    total += static_cast<size_t>(s.end - s.begin) * sections;
  }
  if (out->data.size() < total) out->data.resize(total);
  out->views.clear();
  float* p = out->data.data();
  for (const ShardView& s : shards) {
    const size_t n = static_cast<size_t>(s.end - s.begin);
    ShardView view{s.begin, s.end, nullptr, nullptr, nullptr};
    const float* const* from[3] = {&s.params, &s.adam_m, &s.adam_v};
    const float** to[3] = {&view.params, &view.adam_m, &view.adam_v};
    for (int k = 0; k < 3; ++k) {
      if (*from[k] == nullptr) continue;
      std::memcpy(p, *from[k], n * sizeof(float));
      *to[k] = p;
      p += n;
    }
    out->views.push_back(view);
  }
}

absl::Status CheckpointWriter::Submit(const CheckpointManifest& meta,
                                      absl::Span<const ShardView> shards) {
  for (const ShardView& s : shards) {
    if (s.end <= s.begin || s.begin < 0 || s.params == nullptr) {
      return absl::InvalidArgumentError("CheckpointWriter::Submit: empty or null shard range");
    }
  }
  WaitForSnapshot();  // the previous snapshot's copy, if the caller did not wait for it
  absl::MutexLock lock(&mu_);
  if (queued_ != nullptr && options_.when_busy == CheckpointWriterOptions::WhenBusy::kWait) {
    const auto start = std::chrono::steady_clock::now();
    mu_.Await(absl::Condition(
        +[](std::unique_ptr<Snapshot>* q) { return *q == nullptr; }, &queued_));
    stats_.wait_seconds += SecondsSince(start);
  }
  // After the wait: every write before the one now in flight has finished and reported.
  if (!error_.ok()) {
    absl::Status error = error_;
    error_ = absl::OkStatus();
    return error;
  }
  std::unique_ptr<Snapshot> buffer;
  if (queued_ != nullptr) {  // kSupersede: reuse the queued snapshot's buffer
    buffer = std::move(queued_);
    ++stats_.superseded;
  } else if (!free_.empty()) {
    buffer = std::move(free_.back());
    free_.pop_back();
  } else {  // at most two exist: one writing, this one
    buffer = std::make_unique<Snapshot>();
  }
  buffer->meta = meta;
  copy_from_.assign(shards.begin(), shards.end());
  copying_ = std::move(buffer);
  ++stats_.submitted;
  return absl::OkStatus();
}

void CheckpointWriter::WaitForSnapshot() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::unique_ptr<Snapshot>* c) { return *c == nullptr; }, &copying_));
}

void CheckpointWriter::RunCopies() {
  for (;;) {
    Snapshot* snapshot;
    std::vector<ShardView> from;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->copying_ != nullptr || w->stopping_;
          },
          this));
      if (copying_ == nullptr) return;  // stopping with nothing left
      snapshot = copying_.get();
      from.swap(copy_from_);
    }
    Copy(from, snapshot);  // outside the lock: only this thread touches the buffer now
    absl::MutexLock lock(&mu_);
    queued_ = std::move(copying_);  // Submit left the queue empty (it waited, or took it over)
  }
}

void CheckpointWriter::Run() {
  for (;;) {
    std::unique_ptr<Snapshot> snapshot;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->queued_ != nullptr || (w->stopping_ && w->copying_ == nullptr);
          },
          this));
      if (queued_ == nullptr) return;  // stopping with nothing left
      snapshot = std::move(queued_);
      writing_ = true;
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = store_->Write(snapshot->meta, snapshot->views);
    const double seconds = SecondsSince(start);
    absl::MutexLock lock(&mu_);
    stats_.write_seconds += seconds;
    if (status.ok()) {
      ++stats_.written;
      stats_.last_written_step = snapshot->meta.step;
    } else {
      ++stats_.failed;
      if (error_.ok()) error_ = status;
    }
    free_.push_back(std::move(snapshot));
    writing_ = false;
  }
}

absl::Status CheckpointWriter::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CheckpointWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
        return w->copying_ == nullptr && w->queued_ == nullptr && !w->writing_;
      },
      this));
  absl::Status error = error_;
  error_ = absl::OkStatus();
  return error;
}

CheckpointWriterStats CheckpointWriter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace troupe::train
