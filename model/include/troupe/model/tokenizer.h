// Byte-level BPE tokenizer, trained on the input text, saved as a versioned file.
//
// Ids 0..255 are the bytes, 256.. are merges in the order they were learned, and the last id is
// the end-of-text token that separates documents. Text is first cut into chunks (a run of letters,
// of digits, or of other symbols, each with at most one leading space; whitespace runs alone);
// merges never cross chunks. Training is deterministic: the most frequent pair wins, ties go to
// the smaller (left, right) pair. Any byte string round-trips: Decode(Encode(s)) == s.
//
// File (version 1): magic "TRPBPE\0\0", version u32, vocab_size u32, merge count u32, CRC32C of
// the merges u32, then (left u32, right u32) per merge.
//
// Example:
//   absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Train(documents, /*vocab_size=*/512);
//   std::vector<int32_t> ids = tok->Encode("Hello, world");
//   ASSERT_OK(tok->Save("data/tokenizer.bin"));
#ifndef TROUPE_MODEL_TOKENIZER_H_
#define TROUPE_MODEL_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::model {

inline constexpr uint32_t kTokenizerVersion = 1;

class BpeTokenizer {
 public:
  // vocab_size >= 257 (bytes + end-of-text). Fewer merges result if the text runs out of pairs;
  // the vocabulary size is then smaller than asked.
  [[nodiscard]] static absl::StatusOr<BpeTokenizer> Train(const std::vector<std::string>& documents,
                                                          int32_t vocab_size);
  [[nodiscard]] static absl::StatusOr<BpeTokenizer> Load(const std::string& path);
  [[nodiscard]] absl::Status Save(const std::string& path) const;

  int32_t vocab_size() const { return static_cast<int32_t>(256 + merges_.size() + 1); }
  int32_t eot_token() const { return vocab_size() - 1; }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

  std::vector<int32_t> Encode(const std::string& text) const;
  // Unknown ids decode to nothing; eot decodes to nothing.
  std::string Decode(const std::vector<int32_t>& ids) const;

 private:
  explicit BpeTokenizer(std::vector<std::pair<int32_t, int32_t>> merges);
  void EncodeChunk(const std::string& chunk, std::vector<int32_t>& out) const;

  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::unordered_map<uint64_t, int32_t> rank_;  // (left << 32 | right) -> merge index
  std::vector<std::string> bytes_;              // id -> bytes
};

// Splits text into the pre-tokenization chunks described above.
std::vector<std::string> SplitIntoChunks(const std::string& text);

}  // namespace troupe::model

#endif  // TROUPE_MODEL_TOKENIZER_H_
