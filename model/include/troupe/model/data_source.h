// The training data order: the tokens of microbatch k of step s, as a pure function of
// (dataset, seed, s, k).
//
// The dataset is a list of token shards cut into non-overlapping samples of seq_len + 1 tokens
// (inputs and the targets shifted by one; samples never cross a shard boundary). Sample slots are
// consumed in order — step s, microbatch k, row r is slot g = (s·M + k)·m + r — and slot g reads
// sample PermuteIndex(g mod N, N, seed, epoch = g / N): a fresh seeded permutation every epoch.
// No cursor, no state: any worker can produce any microbatch after any restart or resize.
//
// Example:
//   auto data = DataSource::Open({"data/train-00000.tok"}, 512,
//                                {.seq_len = 64, .microbatch_size = 8,
//                                 .microbatches_per_step = 4, .seed = 1});
//   Microbatch mb;
//   ASSERT_OK(data->Get(/*step=*/10, /*k=*/3, &mb));   // mb.inputs, mb.targets: [8, 64]
#ifndef TROUPE_MODEL_DATA_SOURCE_H_
#define TROUPE_MODEL_DATA_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "troupe/model/token_shard.h"

namespace troupe::model {

struct DataSourceOptions {
  int32_t seq_len = 0;
  int32_t microbatch_size = 0;        // m: sequences per microbatch
  int32_t microbatches_per_step = 0;  // M: microbatches per step (global batch B = M·m)
  uint64_t seed = 0;
  // The data cut into `streams` interleaved streams (training's low-communication groups, each
  // on its own data): step s of stream i reads what step s·streams + i of one stream would, so
  // the streams together read the tokens one stream of streams·M microbatches per step would.
  int32_t stream = 0;
  int32_t streams = 1;
};

struct Microbatch {
  int32_t batch = 0;
  int32_t seq_len = 0;
  std::vector<int32_t> inputs;   // [batch, seq_len]
  std::vector<int32_t> targets;  // [batch, seq_len]
  std::vector<int64_t> samples;  // dataset sample index of each row
};

class DataSource {
 public:
  [[nodiscard]] static absl::StatusOr<DataSource> Open(const std::vector<std::string>& shard_paths,
                                                       int32_t vocab_size,
                                                       const DataSourceOptions& options);

  int64_t num_samples() const { return num_samples_; }
  const DataSourceOptions& options() const { return options_; }
  // Reads stream `stream` of `streams` from now on (DataSourceOptions); InvalidArgument unless
  // 0 <= stream < streams.
  [[nodiscard]] absl::Status SetStream(int32_t stream, int32_t streams);

  // The dataset sample read by row r of microbatch k of step s.
  int64_t SampleIndex(int64_t step, int32_t k, int32_t row) const;
  // InvalidArgument if step < 0 or k is outside [0, microbatches_per_step).
  [[nodiscard]] absl::Status Get(int64_t step, int32_t k, Microbatch* out) const;

 private:
  DataSource() = default;
  void ReadSample(int64_t sample, int32_t* tokens) const;  // seq_len + 1 tokens

  DataSourceOptions options_;
  std::vector<std::shared_ptr<TokenShard>> shards_;
  std::vector<int64_t> first_sample_;  // per shard; plus the total at the end
  int64_t num_samples_ = 0;
};

}  // namespace troupe::model

#endif  // TROUPE_MODEL_DATA_SOURCE_H_
