// troupe data prepare: text files -> BPE tokenizer + token shards (see model/corpus.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "troupe/model/corpus.h"

namespace troupe::tools {
namespace {

constexpr char kUsage[] = "usage: troupe data prepare --input FILES... --out DIR --vocab N\n";

int Prepare(const Args& args) {
  std::vector<std::string> inputs;
  std::string out;
  long vocab = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--input") {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) inputs.push_back(args[++i]);
    } else if (args[i] == "--out" && i + 1 < args.size()) {
      out = args[++i];
    } else if (args[i] == "--vocab" && i + 1 < args.size()) {
      char* end = nullptr;
      vocab = std::strtol(args[++i].c_str(), &end, 10);
      if (end == nullptr || *end != '\0' || vocab <= 0 || vocab > (1L << 30)) {
        std::fprintf(stderr,
                     "troupe data prepare: --vocab: expected a positive integer, got '%s'\n",
                     args[i].c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "troupe data prepare: unexpected argument '%s'\n%s", args[i].c_str(),
                   kUsage);
      return 2;
    }
  }
  if (inputs.empty() || out.empty() || vocab == 0) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<model::PreparedDataset> ds =
      model::PrepareDataset(inputs, out, static_cast<int32_t>(vocab));
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
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}

}  // namespace troupe::tools
