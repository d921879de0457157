#include "troupe/model/tokenizer.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "io_util.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/crc32c.h"

namespace troupe::model {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'B', 'P', 'E', '\0', '\0'};

int CharClass(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return 0;  // letters, UTF-8
  if (c >= '0' && c <= '9') return 1;
  if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v') return 2;
  return 3;  // punctuation and other symbols
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> ids;
  int64_t count;
};

}  // namespace

std::vector<std::string> SplitIntoChunks(const std::string& text) {
  std::vector<std::string> chunks;
  const size_t n = text.size();
  auto cls_at = [&](size_t i) { return CharClass(static_cast<unsigned char>(text[i])); };
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    int cls = cls_at(i);
    if (cls == 2 && text[i] == ' ' && i + 1 < n && cls_at(i + 1) != 2) {
      ++i;  // a single space joins the run that follows it
      cls = cls_at(i);
    }
    while (i < n && cls_at(i) == cls) ++i;
    // A whitespace run gives its last space back to the word that follows.
    if (cls == 2 && i < n && i - start > 1 && text[i - 1] == ' ') --i;
    chunks.push_back(text.substr(start, i - start));
  }
  return chunks;
}

BpeTokenizer::BpeTokenizer(std::vector<std::pair<int32_t, int32_t>> merges)
    : merges_(std::move(merges)) {
  for (int i = 0; i < 256; ++i) bytes_.push_back(std::string(1, static_cast<char>(i)));
  for (size_t m = 0; m < merges_.size(); ++m) {
    rank_[PairKey(merges_[m].first, merges_[m].second)] = static_cast<int32_t>(m);
    bytes_.push_back(bytes_[merges_[m].first] + bytes_[merges_[m].second]);
  }
  bytes_.push_back("");  // end of text
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::Train(const std::vector<std::string>& documents,
                                                 int32_t vocab_size) {
  if (vocab_size < 257) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size: expected at least 257 (256 bytes + end-of-text), got ", vocab_size));
  }
  std::map<std::string, int64_t> counts;  // ordered: deterministic word order
  for (const auto& doc : documents) {
    for (auto& chunk : SplitIntoChunks(doc)) ++counts[chunk];
  }
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [chunk, count] : counts) {
    Word w{{}, count};
    for (unsigned char ch : chunk) w.ids.push_back(ch);
    words.push_back(std::move(w));
  }
  std::unordered_map<uint64_t, int64_t> pair_counts;
  auto count_word = [&](const Word& w, int64_t sign) {
    for (size_t i = 0; i + 1 < w.ids.size(); ++i) {
      pair_counts[PairKey(w.ids[i], w.ids[i + 1])] += sign * w.count;
    }
  };
  for (const Word& w : words) count_word(w, 1);
  std::vector<std::pair<int32_t, int32_t>> merges;
  const int32_t num_merges = vocab_size - 257;
  while (static_cast<int32_t>(merges.size()) < num_merges) {
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && count > 0 && key < best)) {
        best = key;
        best_count = count;
      }
    }
    if (best_count <= 0) break;
    const int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xFFFFFFFF);
    const int32_t id = 256 + static_cast<int32_t>(merges.size());
    merges.emplace_back(a, b);
    for (Word& w : words) {
      bool has = false;
      for (size_t i = 0; i + 1 < w.ids.size() && !has; ++i)
        has = w.ids[i] == a && w.ids[i + 1] == b;
      if (!has) continue;
      count_word(w, -1);
      std::vector<int32_t> merged;
      merged.reserve(w.ids.size());
      for (size_t i = 0; i < w.ids.size(); ++i) {
        if (i + 1 < w.ids.size() && w.ids[i] == a && w.ids[i + 1] == b) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(w.ids[i]);
        }
      }
      w.ids = std::move(merged);
      count_word(w, 1);
    }
    // Drop exhausted pairs so the scan for the best stays short.
    for (auto it = pair_counts.begin(); it != pair_counts.end();) {
      it = it->second == 0 ? pair_counts.erase(it) : std::next(it);
    }
  }
  return BpeTokenizer(std::move(merges));
}

void BpeTokenizer::EncodeChunk(const std::string& chunk, std::vector<int32_t>& out) const {
  std::vector<int32_t> ids(chunk.begin(), chunk.end());
  for (auto& id : ids) id = static_cast<unsigned char>(id);
  for (;;) {
    int32_t best_rank = -1;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto it = rank_.find(PairKey(ids[i], ids[i + 1]));
      if (it != rank_.end() && (best_rank < 0 || it->second < best_rank)) best_rank = it->second;
    }
    if (best_rank < 0) break;
    const auto [a, b] = merges_[best_rank];
    std::vector<int32_t> merged;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
        merged.push_back(256 + best_rank);
        ++i;
      } else {
        merged.push_back(ids[i]);
      }
    }
    ids = std::move(merged);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> BpeTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> out;
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  for (const auto& chunk : SplitIntoChunks(text)) {
    auto it = cache.find(chunk);
    if (it == cache.end()) {
      std::vector<int32_t> ids;
      EncodeChunk(chunk, ids);
      it = cache.emplace(chunk, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id >= 0 && id < static_cast<int32_t>(bytes_.size())) s += bytes_[id];
  }
  return s;
}

absl::Status BpeTokenizer::Save(const std::string& path) const {
  std::string payload;
  for (const auto& [a, b] : merges_) {
    internal::PutU32(payload, static_cast<uint32_t>(a));
    internal::PutU32(payload, static_cast<uint32_t>(b));
  }
  std::string h(kMagic, 8);
  internal::PutU32(h, kTokenizerVersion);
  internal::PutU32(h, static_cast<uint32_t>(vocab_size()));
  internal::PutU32(h, static_cast<uint32_t>(merges_.size()));
  internal::PutU32(h, Crc32c(payload.data(), payload.size()));
  return internal::WriteFileAtomically(path, h, {{payload.data(), payload.size()}});
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::Load(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(std::string file, internal::ReadWholeFile(path));
  const std::string& d = file;
  if (d.size() < 24) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated header: expected 24 bytes, got ", d.size()));
  }
  if (std::memcmp(d.data(), kMagic, 8) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": magic: expected \"TRPBPE\""));
  }
  const uint32_t version = internal::GetU32(d.data() + 8);
  if (version != kTokenizerVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": version: expected ", kTokenizerVersion, ", got ", version));
  }
  const uint32_t vocab = internal::GetU32(d.data() + 12);
  const uint32_t num_merges = internal::GetU32(d.data() + 16);
  if (vocab != 257 + uint64_t{num_merges}) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocab_size: expected 257 + ", num_merges, " merges, got ", vocab));
  }
  if (d.size() != 24 + uint64_t{num_merges} * 8) {
    return absl::DataLossError(absl::StrCat(
        path, ": size: expected ", 24 + uint64_t{num_merges} * 8, " bytes, got ", d.size()));
  }
  const uint32_t crc = internal::GetU32(d.data() + 20);
  if (Crc32c(d.data() + 24, d.size() - 24) != crc) {
    return absl::DataLossError(absl::StrCat(path, ": merges CRC32C mismatch"));
  }
  std::vector<std::pair<int32_t, int32_t>> merges;
  for (uint32_t m = 0; m < num_merges; ++m) {
    const auto a = static_cast<int32_t>(internal::GetU32(d.data() + 24 + 8 * m));
    const auto b = static_cast<int32_t>(internal::GetU32(d.data() + 28 + 8 * m));
    const int32_t limit = 256 + static_cast<int32_t>(m);
    if (a < 0 || b < 0 || a >= limit || b >= limit) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": merge ", m, ": expected ids below ",
                                                     limit, ", got (", a, ", ", b, ")"));
    }
    merges.emplace_back(a, b);
  }
  return BpeTokenizer(std::move(merges));
}

}  // namespace troupe::model
