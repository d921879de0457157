// CRC-32C (Castagnoli) for the checksums in model/'s file formats and checkpoints: the SSE4.2
// crc32 instruction where the CPU has it, else table-driven (slicing-by-8).
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
// The table-driven path alone (what CPUs without SSE4.2 run); tests compare the two.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

}  // namespace troupe::model

#endif  // TROUPE_MODEL_CRC32C_H_
