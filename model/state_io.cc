#include "troupe/model/state_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "io_util.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/crc32c.h"

namespace troupe::model {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'S', 'T', 'A', 'T', 'E'};
constexpr size_t kHeaderSize = 72;

}  // namespace

absl::Status SaveState(const std::string& path, const StateView& s) {
  TROUPE_RETURN_IF_ERROR(s.config.Validate());
  if (s.params == nullptr || (s.adam_m == nullptr) != (s.adam_v == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected params and either both or neither AdamW moments"));
  }
  const int64_t n = ParamLayout(s.config).total_size();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  const bool moments = s.adam_m != nullptr;
  uint32_t crc = Crc32c(s.params, bytes);
  if (moments) {
    crc = Crc32cExtend(crc, s.adam_m, bytes);
    crc = Crc32cExtend(crc, s.adam_v, bytes);
  }
  std::string h(kMagic, 8);
  internal::PutU32(h, kStateVersion);
  internal::PutU32(h, moments ? 1 : 0);
  for (int32_t f : {s.config.vocab_size, s.config.context_length, s.config.num_layers,
                    s.config.num_heads, s.config.width}) {
    internal::PutU32(h, static_cast<uint32_t>(f));
  }
  internal::PutU32(h, 0);
  internal::PutU64(h, static_cast<uint64_t>(s.step));
  internal::PutU64(h, s.seed);
  internal::PutU64(h, static_cast<uint64_t>(n));
  internal::PutU32(h, crc);
  internal::PutU32(h, Crc32c(h.data(), h.size()));
  if (moments) {
    return internal::WriteFileAtomically(path, h,
                                         {{s.params, bytes}, {s.adam_m, bytes}, {s.adam_v, bytes}});
  }
  return internal::WriteFileAtomically(path, h, {{s.params, bytes}});
}

absl::StatusOr<LoadedState> LoadState(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(std::string file, internal::ReadWholeFile(path));
  const std::string& d = file;
  if (d.size() < kHeaderSize) {
    return absl::DataLossError(absl::StrCat(path, ": truncated state header: expected ",
                                            kHeaderSize, " bytes, got ", d.size()));
  }
  if (std::memcmp(d.data(), kMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": magic: expected \"TRPSTATE\", got \"", d.substr(0, 8), "\""));
  }
  const uint32_t version = internal::GetU32(d.data() + 8);
  if (version != kStateVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": version: expected ", kStateVersion, ", got ", version));
  }
  const uint32_t header_crc = internal::GetU32(d.data() + 68);
  if (Crc32c(d.data(), 68) != header_crc) {
    return absl::DataLossError(absl::StrCat(path, ": header checksum mismatch: expected ",
                                            header_crc, ", got ", Crc32c(d.data(), 68)));
  }
  LoadedState s;
  const uint32_t flags = internal::GetU32(d.data() + 12);
  s.config = {static_cast<int32_t>(internal::GetU32(d.data() + 16)),
              static_cast<int32_t>(internal::GetU32(d.data() + 20)),
              static_cast<int32_t>(internal::GetU32(d.data() + 24)),
              static_cast<int32_t>(internal::GetU32(d.data() + 28)),
              static_cast<int32_t>(internal::GetU32(d.data() + 32))};
  if (absl::Status st = s.config.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  }
  s.step = static_cast<int64_t>(internal::GetU64(d.data() + 40));
  s.seed = internal::GetU64(d.data() + 48);
  const uint64_t n = internal::GetU64(d.data() + 56);
  const uint64_t want_n = static_cast<uint64_t>(ParamLayout(s.config).total_size());
  if (n != want_n) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": num_params: expected ", want_n, " for ",
                                                   s.config.DebugString(), ", got ", n));
  }
  const bool moments = flags & 1;
  const uint64_t want_size = kHeaderSize + n * sizeof(float) * (moments ? 3 : 1);
  if (d.size() != want_size) {
    return absl::DataLossError(
        absl::StrCat(path, ": size: expected ", want_size, " bytes, got ", d.size()));
  }
  const uint32_t crc = internal::GetU32(d.data() + 64);
  const uint32_t got_crc = Crc32c(d.data() + kHeaderSize, d.size() - kHeaderSize);
  if (crc != got_crc) {
    return absl::DataLossError(
        absl::StrCat(path, ": payload CRC32C: expected ", crc, ", got ", got_crc));
  }
  auto take = [&](std::vector<float>& v, size_t index) {
    v.resize(n);
    std::memcpy(v.data(), d.data() + kHeaderSize + index * n * sizeof(float), n * sizeof(float));
  };
  take(s.params, 0);
  if (moments) {
    take(s.adam_m, 1);
    take(s.adam_v, 2);
  }
  return s;
}

}  // namespace troupe::model
