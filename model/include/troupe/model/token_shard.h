// Binary token shards: a fixed little-endian header and the token ids, read through mmap.
//
// Layout (version 1), 32-byte header: magic "TRPTOKEN", version u32, token width in bytes u32
// (2 = uint16, 4 = uint32), vocabulary size u32, CRC32C of the payload u32, token count u64; then
// the tokens. Open() checks everything before returning — size, magic, version, width, checksum,
// and that every id is below the vocabulary — so readers never see garbage: a damaged file is
// DataLoss, a foreign or inconsistent one InvalidArgument, each naming the file and the expected
// and actual values.
//
// Example:
//   ASSERT_OK(WriteTokenShard("data/train-00000.tok", tokens, /*vocab_size=*/512));
//   absl::StatusOr<std::unique_ptr<TokenShard>> shard = TokenShard::Open(path, 512);
//   int32_t first = (*shard)->token(0);
#ifndef TROUPE_MODEL_TOKEN_SHARD_H_
#define TROUPE_MODEL_TOKEN_SHARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::model {

inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderSize = 32;

// Writes uint16 tokens when vocab_size <= 65536, else uint32. Every id must be in [0, vocab_size).
[[nodiscard]] absl::Status WriteTokenShard(const std::string& path,
                                           const std::vector<int32_t>& tokens, int32_t vocab_size);

class TokenShard {
 public:
  // expected_vocab_size > 0 also requires the header's vocabulary to equal it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TokenShard>> Open(
      const std::string& path, int32_t expected_vocab_size);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int32_t vocab_size() const { return vocab_size_; }
  int32_t token(int64_t i) const {
    return width_ == 2 ? static_cast<const uint16_t*>(tokens_)[i]
                       : static_cast<int32_t>(static_cast<const uint32_t*>(tokens_)[i]);
  }
  // Copies tokens [begin, begin + n) into out.
  void Read(int64_t begin, int64_t n, int32_t* out) const;

 private:
  TokenShard() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const void* tokens_ = nullptr;
  int64_t count_ = 0;
  uint32_t width_ = 0;
  int32_t vocab_size_ = 0;
};

}  // namespace troupe::model

#endif  // TROUPE_MODEL_TOKEN_SHARD_H_
