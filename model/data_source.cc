#include "troupe/model/data_source.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/rng.h"

namespace troupe::model {

absl::StatusOr<DataSource> DataSource::Open(const std::vector<std::string>& shard_paths,
                                            int32_t vocab_size, const DataSourceOptions& options) {
  if (options.seq_len <= 0 || options.microbatch_size <= 0 || options.microbatches_per_step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataSourceOptions: expected positive seq_len, microbatch_size, microbatches_per_step, "
        "got ",
        options.seq_len, ", ", options.microbatch_size, ", ", options.microbatches_per_step));
  }
  if (shard_paths.empty()) {
    return absl::InvalidArgumentError("DataSource: expected at least one shard, got none");
  }
  DataSource ds;
  ds.options_ = options;
  TROUPE_RETURN_IF_ERROR(ds.SetStream(options.stream, options.streams));
  const int64_t sample_tokens = int64_t{options.seq_len} + 1;
  for (const auto& path : shard_paths) {
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<TokenShard> shard, TokenShard::Open(path, vocab_size));
    ds.first_sample_.push_back(ds.num_samples_);
    ds.num_samples_ += shard->size() / sample_tokens;
    ds.shards_.push_back(std::move(shard));
  }
  ds.first_sample_.push_back(ds.num_samples_);
  if (ds.num_samples_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat("DataSource: expected at least one sample of ",
                                                   sample_tokens, " tokens in ", shard_paths.size(),
                                                   " shard(s), got none"));
  }
  return ds;
}

absl::Status DataSource::SetStream(int32_t stream, int32_t streams) {
  if (streams < 1 || stream < 0 || stream >= streams) {
    return absl::InvalidArgumentError(
        absl::StrCat("data stream ", stream, " of ", streams, ": expected 0 <= stream < streams"));
  }
  options_.stream = stream;
  options_.streams = streams;
  return absl::OkStatus();
}

int64_t DataSource::SampleIndex(int64_t step, int32_t k, int32_t row) const {
  const int64_t data_step = step * options_.streams + options_.stream;
  const int64_t slot =
      (data_step * options_.microbatches_per_step + k) * int64_t{options_.microbatch_size} + row;
  const uint64_t n = static_cast<uint64_t>(num_samples_);
  const uint64_t epoch = static_cast<uint64_t>(slot) / n;
  return static_cast<int64_t>(PermuteIndex(static_cast<uint64_t>(slot) % n, n, options_.seed,
                                           static_cast<uint32_t>(epoch)));
}

void DataSource::ReadSample(int64_t sample, int32_t* tokens) const {
  const auto it = std::upper_bound(first_sample_.begin(), first_sample_.end(), sample);
  const size_t shard = static_cast<size_t>(it - first_sample_.begin()) - 1;
  const int64_t local = sample - first_sample_[shard];
  const int64_t len = int64_t{options_.seq_len} + 1;
  shards_[shard]->Read(local * len, len, tokens);
}

absl::Status DataSource::Get(int64_t step, int32_t k, Microbatch* out) const {
  if (step < 0 || k < 0 || k >= options_.microbatches_per_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("DataSource::Get: expected step >= 0 and k in [0, ",
                     options_.microbatches_per_step, "), got step=", step, " k=", k));
  }
  const int32_t m = options_.microbatch_size, t = options_.seq_len;
  out->batch = m;
  out->seq_len = t;
  out->inputs.resize(int64_t{m} * t);
  out->targets.resize(int64_t{m} * t);
  out->samples.resize(m);
  std::vector<int32_t> buf(t + 1);
  for (int32_t r = 0; r < m; ++r) {
    out->samples[r] = SampleIndex(step, k, r);
    ReadSample(out->samples[r], buf.data());
    std::copy(buf.begin(), buf.end() - 1, out->inputs.begin() + int64_t{r} * t);
    std::copy(buf.begin() + 1, buf.end(), out->targets.begin() + int64_t{r} * t);
  }
  return absl::OkStatus();
}

}  // namespace troupe::model
