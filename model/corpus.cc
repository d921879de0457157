#include "troupe/model/corpus.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "io_util.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/token_shard.h"
#include "troupe/model/tokenizer.h"

namespace troupe::model {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void SplitDocuments(const std::string& text, std::vector<std::string>& out) {
  std::string doc;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    if (line == "%") {
      if (!doc.empty()) out.push_back(std::move(doc));
      doc.clear();
    } else {
      doc += line;
      if (eol < text.size()) doc += '\n';
    }
    pos = eol + 1;
  }
  if (!doc.empty()) out.push_back(std::move(doc));
}

}  // namespace

std::vector<std::string> FortunesCorpusFiles(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return files;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || EndsWith(name, ".dat") || EndsWith(name, ".u8")) continue;
    const std::string path = dir + "/" + name;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::vector<std::string>> ReadDocuments(
    const std::vector<std::string>& paths, const std::function<void(int64_t bytes)>& on_file_read) {
  std::vector<std::string> docs;
  for (const auto& path : paths) {
    TROUPE_ASSIGN_OR_RETURN(std::string text, internal::ReadWholeFile(path));
    if (on_file_read) on_file_read(static_cast<int64_t>(text.size()));
    SplitDocuments(text, docs);
  }
  return docs;
}

absl::StatusOr<PreparedDataset> PrepareDataset(
    const std::vector<std::string>& input_paths, const std::string& out_dir, int32_t vocab_size,
    const std::function<void(int64_t bytes)>& on_file_read) {
  if (input_paths.empty()) {
    return absl::InvalidArgumentError("--input: expected at least one text file, got none");
  }
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> docs, ReadDocuments(input_paths, on_file_read));
  if (docs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input: expected text, got ", input_paths.size(), " empty file(s)"));
  }
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat(out_dir, ": cannot create: ", std::strerror(errno)));
  }
  TROUPE_ASSIGN_OR_RETURN(BpeTokenizer tok, BpeTokenizer::Train(docs, vocab_size));
  PreparedDataset out;
  out.vocab_size = tok.vocab_size();
  out.documents = static_cast<int64_t>(docs.size());
  out.tokenizer_path = out_dir + "/tokenizer.bin";
  TROUPE_RETURN_IF_ERROR(tok.Save(out.tokenizer_path));
  std::vector<int32_t> train, val;
  for (size_t i = 0; i < docs.size(); ++i) {
    out.text_bytes += static_cast<int64_t>(docs[i].size());
    std::vector<int32_t>& dst = (i % 20 == 19) ? val : train;
    const std::vector<int32_t> ids = tok.Encode(docs[i]);
    dst.insert(dst.end(), ids.begin(), ids.end());
    dst.push_back(tok.eot_token());
  }
  out.train_shards.push_back(out_dir + "/train-00000.tok");
  out.val_shards.push_back(out_dir + "/val-00000.tok");
  TROUPE_RETURN_IF_ERROR(WriteTokenShard(out.train_shards[0], train, out.vocab_size));
  TROUPE_RETURN_IF_ERROR(WriteTokenShard(out.val_shards[0], val, out.vocab_size));
  out.train_tokens = static_cast<int64_t>(train.size());
  out.val_tokens = static_cast<int64_t>(val.size());
  return out;
}

}  // namespace troupe::model
