// Text corpora and dataset preparation: documents from text files, the tokenizer trained on them,
// and token shards — what `troupe data prepare` runs.
//
// A line holding only "%" separates documents (the fortune(6) format); other files are one
// document each. The Debian `fortunes` package (~2.5 MB of English under
// /usr/share/games/fortunes) is the project's test corpus; it is installed, never committed.
//
// Example:
//   std::vector<std::string> files = FortunesCorpusFiles();
//   absl::StatusOr<PreparedDataset> ds = PrepareDataset(files, "/tmp/data", /*vocab_size=*/512);
//   // ds->tokenizer_path, ds->train_shards, ds->val_shards
#ifndef TROUPE_MODEL_CORPUS_H_
#define TROUPE_MODEL_CORPUS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::model {

inline constexpr char kFortunesDir[] = "/usr/share/games/fortunes";

// The fortune text files (no .dat/.u8 companions), sorted by name; empty if not installed.
std::vector<std::string> FortunesCorpusFiles(const std::string& dir = kFortunesDir);

// Reads the files and splits them into documents (empty documents dropped). Calls
// on_file_read(bytes) after each file, for progress reports.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ReadDocuments(
    const std::vector<std::string>& paths,
    const std::function<void(int64_t bytes)>& on_file_read = {});

struct PreparedDataset {
  std::string tokenizer_path;
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  int32_t vocab_size = 0;
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t text_bytes = 0;
};

// Trains a BPE tokenizer of vocab_size on the documents, encodes every document followed by the
// end-of-text token, and writes out_dir/tokenizer.bin, out_dir/train-00000.tok and
// out_dir/val-00000.tok (every 20th document goes to validation). Creates out_dir if needed.
// on_file_read: as for ReadDocuments.
[[nodiscard]] absl::StatusOr<PreparedDataset> PrepareDataset(
    const std::vector<std::string>& input_paths, const std::string& out_dir, int32_t vocab_size,
    const std::function<void(int64_t bytes)>& on_file_read = {});

}  // namespace troupe::model

#endif  // TROUPE_MODEL_CORPUS_H_
