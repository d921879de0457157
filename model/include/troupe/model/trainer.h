// Single-process training: the reference the elastic trainer must match bit for bit.
//
// One Step() computes every microbatch gradient (ZeroGrad, Forward, Backward with weight
// 1/(M·m·T)), sums them in the canonical tree order (TreeAccumulator), takes the global gradient
// norm from fixed chunks, and applies AdamW with the step's scalars over the whole flat buffer —
// exactly the pieces a sharded run distributes. Not thread-safe; kernels parallelise inside.
//
// Example:
//   auto data = DataSource::Open(shards, vocab, {.seq_len = 64, .microbatch_size = 8,
//                                                .microbatches_per_step = 2, .seed = 1});
//   auto trainer = Trainer::Create({.config = GptConfig::Tiny(vocab), .init_seed = 1}, &*data);
//   for (int i = 0; i < 100; ++i) double loss = *trainer->Step();
#ifndef TROUPE_MODEL_TRAINER_H_
#define TROUPE_MODEL_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/model/data_source.h"
#include "troupe/model/gpt.h"
#include "troupe/model/optimizer.h"

namespace troupe::model {

struct TrainerOptions {
  GptConfig config;
  AdamWConfig adamw;
  LrSchedule schedule;
  uint64_t init_seed = 1;
};

class Trainer {
 public:
  // data must outlive the trainer; its seq_len must not exceed config.context_length.
  [[nodiscard]] static absl::StatusOr<Trainer> Create(const TrainerOptions& options,
                                                      const DataSource* data);

  // Runs step step() and advances; returns the step's mean loss. `before_update`, if set, runs
  // after the passes (which only read the parameters and moments) and before AdamW changes them:
  // e.g. CheckpointWriter::WaitForSnapshot, whose copy of the state then overlaps the passes.
  [[nodiscard]] absl::StatusOr<double> Step(const std::function<void()>& before_update = {});

  int64_t step() const { return step_; }
  double last_grad_norm() const { return last_grad_norm_; }
  Gpt& model() { return model_; }
  const std::vector<float>& adam_m() const { return m_; }
  const std::vector<float>& adam_v() const { return v_; }

  [[nodiscard]] absl::Status Save(const std::string& path) const;
  // Loads params, moments and step; InvalidArgument if the file's config differs.
  [[nodiscard]] absl::Status Restore(const std::string& path);

 private:
  Trainer(const TrainerOptions& options, Gpt model, const DataSource* data);

  TrainerOptions options_;
  Gpt model_;
  const DataSource* data_;
  std::vector<float> m_, v_, step_grad_;
  int64_t step_ = 0;
  double last_grad_norm_ = 0;
};

}  // namespace troupe::model

#endif  // TROUPE_MODEL_TRAINER_H_
