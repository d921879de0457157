// Little-endian encoding and whole-file helpers shared by model/'s file formats. Private.
#ifndef TROUPE_MODEL_IO_UTIL_H_
#define TROUPE_MODEL_IO_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::model::internal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "model/ file formats are little-endian and written by memcpy on LE hosts");

inline void PutU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}
inline void PutU64(std::string& out, uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}
inline uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

[[nodiscard]] absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Writes header then each (data, size) chunk to path + ".tmp", fsyncs, renames over path.
struct Chunk {
  const void* data;
  size_t size;
};
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& path, const std::string& header,
                                               std::initializer_list<Chunk> chunks);

}  // namespace troupe::model::internal

#endif  // TROUPE_MODEL_IO_UTIL_H_
