// troupe data prepare: text files -> BPE tokenizer + token shards (see model/corpus.h).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "commands.h"
#include "progress_bar.h"
#include "troupe/model/corpus.h"
#include "troupe/runtime/config.h"

namespace troupe::tools {
namespace {

constexpr char kUsage[] =
    "usage: troupe data prepare --input FILES... --out DIR --vocab N\n"
    "Trains a BPE tokenizer of N tokens on the text files and writes it with train/val token\n"
    "shards into DIR.";

int Prepare(const Args& args) {
  std::vector<std::string> inputs;
  std::string out;
  int64_t vocab = 0;
  runtime::ConfigRegistry config;
  config.AddStringList("input", &inputs, "text files to tokenize (required)");
  config.AddString("out", &out, "directory for the tokenizer and the shards (required)");
  config.AddInt("vocab", &vocab, "tokenizer vocabulary size (required)",
                runtime::InRange(1, int64_t{1} << 30));
  if (int rc = runtime::ParseCommandLine("data prepare", kUsage, args, config); rc >= 0) return rc;
  const char* missing = inputs.empty() ? "input" : out.empty() ? "out" : vocab == 0 ? "vocab" : "";
  if (*missing != '\0') {
    std::fprintf(stderr, "troupe data prepare: option '%s' is required (see --help)\n", missing);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  // The bar covers reading the inputs; a file that cannot be stat'ed fails in the read below.
  int64_t input_bytes = 0;
  for (const std::string& path : inputs) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) input_bytes += st.st_size;
  }
  ProgressBar bar("reading inputs", input_bytes, stderr, ::isatty(fileno(stderr)));
  absl::StatusOr<model::PreparedDataset> ds = model::PrepareDataset(
      inputs, out, static_cast<int32_t>(vocab), [&bar](int64_t bytes) { bar.Add(bytes); });
  bar.Done();
  if (!ds.ok()) {
    std::fprintf(stderr, "troupe data prepare: %s\n", ds.status().ToString().c_str());
    return 1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("tokenizer: %s (vocab %d)\n", ds->tokenizer_path.c_str(), ds->vocab_size);
  std::printf("train: %s (%lld tokens)\nval: %s (%lld tokens)\n", ds->train_shards[0].c_str(),
              static_cast<long long>(ds->train_tokens), ds->val_shards[0].c_str(),
              static_cast<long long>(ds->val_tokens));
  std::printf("documents=%lld text_bytes=%lld bytes_per_token=%.3f seconds=%.2f\n",
              static_cast<long long>(ds->documents), static_cast<long long>(ds->text_bytes),
              static_cast<double>(ds->text_bytes) / (ds->train_tokens + ds->val_tokens), secs);
  return 0;
}

}  // namespace

int RunData(const Args& args) {
  if (!args.empty() && args[0] == "prepare") return Prepare(Args(args.begin() + 1, args.end()));
  const bool help = !args.empty() && (args[0] == "--help" || args[0] == "-h");
  std::fprintf(help ? stdout : stderr, "%s\n", kUsage);
  return help ? 0 : 2;
}

}  // namespace troupe::tools
