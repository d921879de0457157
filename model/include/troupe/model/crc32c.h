// CRC-32C (Castagnoli), table-driven (slicing-by-8), for the checksums in model/'s file formats.
//
// Example:
//   uint32_t crc = Crc32c(data, size);
//   crc = Crc32cExtend(crc, more, more_size);  // same as one call over both
#ifndef TROUPE_MODEL_CRC32C_H_
#define TROUPE_MODEL_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace troupe::model {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

}  // namespace troupe::model

#endif  // TROUPE_MODEL_CRC32C_H_
