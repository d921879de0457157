#include "troupe/train/manifest.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint.capnp.h"
#include "envelope.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/crc32c.h"

namespace troupe::train {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'C', 'K', 'M', 'A', 'N'};
constexpr int64_t kMaxParams = int64_t{1} << 40;

absl::Status Loss(const std::string& file, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint manifest ", file, ": ", what));
}

bool SafeFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    if (c == '/' || c == '\0') return false;
  }
  return true;
}

}  // namespace

bool ShardFileInfo::operator==(const ShardFileInfo& o) const {
  return name == o.name && begin == o.begin && end == o.end && byte_size == o.byte_size &&
         crc32c == o.crc32c;
}

bool CheckpointManifest::operator==(const CheckpointManifest& o) const {
  return format_version == o.format_version && gpt_config == o.gpt_config &&
         num_params == o.num_params && step == o.step && seed == o.seed &&
         world_size == o.world_size && generation == o.generation && has_moments == o.has_moments &&
         has_outer == o.has_outer && optimizer_step == o.optimizer_step && shards == o.shards;
}

std::string CheckpointManifest::DebugString() const {
  return absl::StrCat("CheckpointManifest{step=", step, " num_params=", num_params,
                      " shards=", shards.size(), " world_size=", world_size,
                      " generation=", generation, " moments=", has_moments ? "yes" : "no",
                      " outer=", has_outer ? "yes" : "no",
                      " gpt=", gpt_config ? gpt_config->DebugString() : "none", "}");
}

uint64_t ShardByteSize(int64_t begin, int64_t end, bool has_moments, bool has_outer) {
  return static_cast<uint64_t>(end - begin) * sizeof(float) *
         (1 + (has_moments ? 2 : 0) + (has_outer ? 2 : 0));
}

absl::Status ValidateManifest(const CheckpointManifest& m, const std::string& file) {
  if (m.format_version != kCheckpointFormatVersion) {
    return Loss(file, absl::StrCat("format version ", m.format_version, ", expected ",
                                   kCheckpointFormatVersion));
  }
  if (m.num_params <= 0 || m.num_params > kMaxParams) {
    return Loss(file, absl::StrCat("num_params ", m.num_params, ", expected 1..", kMaxParams));
  }
  if (m.step < 0) return Loss(file, absl::StrCat("step ", m.step, " < 0"));
  if (m.world_size < 1) return Loss(file, absl::StrCat("world_size ", m.world_size, " < 1"));
  if (m.gpt_config) {
    if (absl::Status s = m.gpt_config->Validate(); !s.ok()) {
      return Loss(file, absl::StrCat("model config: ", s.message()));
    }
    // ParamLayout allocates per layer: bound what a hostile manifest can make it do.
    if (m.gpt_config->num_layers > 4096 ||
        int64_t{m.gpt_config->context_length} * m.gpt_config->width > kMaxParams) {
      return Loss(file, "model config: " + m.gpt_config->DebugString() + " is implausibly large");
    }
    const int64_t expected = model::ParamLayout(*m.gpt_config).total_size();
    if (expected != m.num_params) {
      return Loss(file,
                  absl::StrCat("num_params ", m.num_params, ", the model config has ", expected));
    }
  }
  if (m.shards.empty() || m.shards.size() > kMaxShardFiles) {
    return Loss(file, absl::StrCat(m.shards.size(), " shard files, expected 1..", kMaxShardFiles));
  }
  int64_t next = 0;
  absl::flat_hash_set<absl::string_view> names;  // O(shards), not O(shards²): 8,192 at scale
  names.reserve(m.shards.size());
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardFileInfo& s = m.shards[i];
    if (!SafeFileName(s.name)) return Loss(file, absl::StrCat("shard ", i, ": bad file name"));
    if (s.begin != next || s.end <= s.begin || s.end > m.num_params) {
      return Loss(file, absl::StrCat("shard ", i, " (", s.name, ") covers [", s.begin, ", ", s.end,
                                     "), expected to start at ", next, " and end after it, by ",
                                     m.num_params));
    }
    const uint64_t bytes = ShardByteSize(s.begin, s.end, m.has_moments, m.has_outer);
    if (s.byte_size != bytes) {
      return Loss(file, absl::StrCat("shard ", i, " (", s.name, ") byte size ", s.byte_size,
                                     ", its range needs ", bytes));
    }
    if (!names.insert(s.name).second) return Loss(file, "duplicate shard file name " + s.name);
    next = s.end;
  }
  if (next != m.num_params) {
    return Loss(file, absl::StrCat("shards end at ", next, ", expected ", m.num_params));
  }
  return absl::OkStatus();
}

std::string EncodeManifest(const CheckpointManifest& m) {
  capnp::MallocMessageBuilder builder;
  schema::Manifest::Builder root = builder.initRoot<schema::Manifest>();
  root.setFormatVersion(m.format_version);
  if (m.gpt_config) {
    schema::GptConfig::Builder c = root.initModel();
    c.setVocabSize(m.gpt_config->vocab_size);
    c.setContextLength(m.gpt_config->context_length);
    c.setNumLayers(m.gpt_config->num_layers);
    c.setNumHeads(m.gpt_config->num_heads);
    c.setWidth(m.gpt_config->width);
  }
  root.setNumParams(m.num_params);
  root.setStep(m.step);
  root.setSeed(m.seed);
  schema::WorldLayout::Builder layout = root.initLayout();
  layout.setWorldSize(m.world_size);
  layout.setGeneration(m.generation);
  root.setHasMoments(m.has_moments);
  root.setHasOuter(m.has_outer);
  root.setOptimizerStep(m.optimizer_step);
  auto shards = root.initShards(static_cast<unsigned>(m.shards.size()));
  for (size_t i = 0; i < m.shards.size(); ++i) {
    auto s = shards[static_cast<unsigned>(i)];
    s.setName(m.shards[i].name);
    s.setBegin(m.shards[i].begin);
    s.setEnd(m.shards[i].end);
    s.setByteSize(m.shards[i].byte_size);
    s.setCrc32c(m.shards[i].crc32c);
  }
  return SealMessage(absl::string_view(kMagic, sizeof(kMagic)), builder);
}

absl::StatusOr<CheckpointManifest> DecodeManifest(absl::string_view bytes,
                                                  const std::string& file) {
  TROUPE_ASSIGN_OR_RETURN(
      kj::Array<capnp::word> sealed,
      UnsealMessage(bytes, absl::string_view(kMagic, sizeof(kMagic)), kMaxManifestBytes,
                    absl::StrCat("checkpoint manifest ", file)));
  kj::Array<capnp::word> words = std::move(sealed);
  const size_t length = words.size() * sizeof(capnp::word);
  CheckpointManifest m;
  std::string error;
  kj::Maybe<kj::Exception> exception = kj::runCatchingExceptions([&]() {
    // Every word is read once (each pointer followed once, below), so the message's own size
    // bounds the traversal: a hostile message cannot make the reader do more work than its bytes.
    capnp::ReaderOptions options;
    options.traversalLimitInWords = length / sizeof(capnp::word) + 64;
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    schema::Manifest::Reader root = reader.getRoot<schema::Manifest>();
    m.format_version = root.getFormatVersion();
    if (root.hasModel()) {
      schema::GptConfig::Reader c = root.getModel();
      model::GptConfig config{c.getVocabSize(), c.getContextLength(), c.getNumLayers(),
                              c.getNumHeads(), c.getWidth()};
      if (!(config == model::GptConfig{})) m.gpt_config = config;
    }
    m.num_params = root.getNumParams();
    m.step = root.getStep();
    m.seed = root.getSeed();
    schema::WorldLayout::Reader layout = root.getLayout();
    m.world_size = layout.getWorldSize();
    m.generation = layout.getGeneration();
    m.has_moments = root.getHasMoments();
    m.has_outer = root.getHasOuter();
    m.optimizer_step = root.getOptimizerStep();
    auto shards = root.getShards();
    if (shards.size() > kMaxShardFiles) {
      error = absl::StrCat(shards.size(), " shard files, at most ", kMaxShardFiles);
      return;
    }
    m.shards.reserve(shards.size());
    for (auto s : shards) {
      capnp::Text::Reader name = s.getName();
      m.shards.push_back(ShardFileInfo{std::string(name.cStr(), name.size()), s.getBegin(),
                                       s.getEnd(), s.getByteSize(), s.getCrc32c()});
    }
  });
  KJ_IF_MAYBE (e, exception) {
    return Loss(file, absl::StrCat("undecodable message: ", e->getDescription().cStr()));
  }
  if (!error.empty()) return Loss(file, error);
  TROUPE_RETURN_IF_ERROR(ValidateManifest(m, file));
  return m;
}

}  // namespace troupe::train
