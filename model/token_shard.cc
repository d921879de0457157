#include "troupe/model/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "io_util.h"
#include "troupe/model/crc32c.h"

namespace troupe::model {
namespace {
constexpr char kMagic[8] = {'T', 'R', 'P', 'T', 'O', 'K', 'E', 'N'};
}  // namespace

absl::Status WriteTokenShard(const std::string& path, const std::vector<int32_t>& tokens,
                             int32_t vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocab_size: expected > 0, got ", vocab_size));
  }
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  std::string payload;
  payload.reserve(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token[", i, "]: expected an id in [0, ", vocab_size, "), got ", t));
    }
    if (width == 2) {
      const uint16_t v = static_cast<uint16_t>(t);
      payload.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      internal::PutU32(payload, static_cast<uint32_t>(t));
    }
  }
  std::string h(kMagic, 8);
  internal::PutU32(h, kTokenShardVersion);
  internal::PutU32(h, width);
  internal::PutU32(h, static_cast<uint32_t>(vocab_size));
  internal::PutU32(h, Crc32c(payload.data(), payload.size()));
  internal::PutU64(h, tokens.size());
  return internal::WriteFileAtomically(path, h, {{payload.data(), payload.size()}});
}

absl::StatusOr<std::unique_ptr<TokenShard>> TokenShard::Open(const std::string& path,
                                                             int32_t expected_vocab_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kTokenShardHeaderSize) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": truncated header: expected at least ",
                                            kTokenShardHeaderSize, " bytes, got ", size));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  std::unique_ptr<TokenShard> shard(new TokenShard());
  shard->path_ = path;
  shard->map_ = map;
  shard->map_size_ = size;
  const char* d = static_cast<const char*>(map);
  if (std::memcmp(d, kMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": magic: expected \"TRPTOKEN\", got \"", std::string(d, 8), "\""));
  }
  const uint32_t version = internal::GetU32(d + 8);
  if (version != kTokenShardVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": version: expected ", kTokenShardVersion, ", got ", version));
  }
  shard->width_ = internal::GetU32(d + 12);
  if (shard->width_ != 2 && shard->width_ != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": token width: expected 2 or 4 bytes, got ", shard->width_));
  }
  shard->vocab_size_ = static_cast<int32_t>(internal::GetU32(d + 16));
  if (expected_vocab_size > 0 && shard->vocab_size_ != expected_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": vocab_size: expected ", expected_vocab_size, ", got ", shard->vocab_size_));
  }
  const uint32_t crc = internal::GetU32(d + 20);
  shard->count_ = static_cast<int64_t>(internal::GetU64(d + 24));
  const uint64_t want =
      kTokenShardHeaderSize + static_cast<uint64_t>(shard->count_) * shard->width_;
  if (shard->count_ < 0 || want != size) {
    return absl::DataLossError(absl::StrCat(path, ": size: expected ", want, " bytes for ",
                                            shard->count_, " tokens, got ", size));
  }
  shard->tokens_ = d + kTokenShardHeaderSize;
  const uint32_t got_crc = Crc32c(shard->tokens_, size - kTokenShardHeaderSize);
  if (got_crc != crc) {
    return absl::DataLossError(
        absl::StrCat(path, ": payload CRC32C: expected ", crc, ", got ", got_crc));
  }
  for (int64_t i = 0; i < shard->count_; ++i) {
    const int32_t t = shard->token(i);
    if (t < 0 || t >= shard->vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": token[", i, "]: expected an id below ", shard->vocab_size_, ", got ", t));
    }
  }
  return shard;
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

void TokenShard::Read(int64_t begin, int64_t n, int32_t* out) const {
  for (int64_t i = 0; i < n; ++i) out[i] = token(begin + i);
}

}  // namespace troupe::model
