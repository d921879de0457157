#include "troupe/train/checkpoint_store.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "troupe/base/crash_point.h"
#include "troupe/base/status_macros.h"
#include "troupe/model/crc32c.h"

namespace troupe::train {
namespace {

constexpr char kManifestName[] = "manifest.bin";
constexpr char kLatestName[] = "LATEST";
constexpr char kFenceName[] = "FENCE";
constexpr char kStepPrefix[] = "step-";
constexpr size_t kIoChunk = size_t{4} << 20;
// Shard files Write has in flight at once.
constexpr size_t kWriteThreads = 4;

bool ParseStepName(absl::string_view name, int64_t* step) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.empty()) return false;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(name, step) && *step >= 0;
}

// Appends bytes in chunks, extending crc as it goes (the chunk is still in cache).
absl::Status AppendWithCrc(WritableFile* file, const void* data, size_t size, uint32_t* crc) {
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < size; done += kIoChunk) {
    const size_t n = std::min(kIoChunk, size - done);
    *crc = model::Crc32cExtend(*crc, p + done, n);
    TROUPE_RETURN_IF_ERROR(file->Append(p + done, n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Checkpoint::ReadRange(int64_t begin, int64_t end, float* params, float* adam_m,
                                   float* adam_v) const {
  if ((adam_m || adam_v) && !manifest_.has_moments) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir_, " holds no optimizer moments"));
  }
  return ReadSections(begin, end,
                      manifest_.has_moments ? std::vector<float*>{params, adam_m, adam_v}
                                            : std::vector<float*>{params});
}

absl::Status Checkpoint::ReadOuterRange(int64_t begin, int64_t end, float* global,
                                        float* momentum) const {
  if (!manifest_.has_outer) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir_, " holds no low-communication outer state"));
  }
  std::vector<float*> outs(manifest_.has_moments ? 3 : 1, nullptr);
  outs.insert(outs.end(), {global, momentum});
  return ReadSections(begin, end, outs);
}

absl::Status Checkpoint::ReadSections(int64_t begin, int64_t end,
                                      const std::vector<float*>& outs) const {
  const CheckpointManifest& m = manifest_;
  if (begin < 0 || end < begin || end > m.num_params) {
    return absl::InvalidArgumentError(absl::StrCat("ReadRange [", begin, ", ", end,
                                                   "): expected within [0, ", m.num_params,
                                                   ") of checkpoint ", dir_));
  }
  // First shard whose end is past begin; shards are contiguous and in order (validated).
  auto it = std::upper_bound(m.shards.begin(), m.shards.end(), begin,
                             [](int64_t b, const ShardFileInfo& s) { return b < s.end; });
  for (; it != m.shards.end() && it->begin < end; ++it) {
    const std::string path = absl::StrCat(dir_, "/", it->name);
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, fs_->OpenForRead(path));
    if (file->size() != it->byte_size) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", file->size(), " bytes, manifest says ", it->byte_size));
    }
    const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->end);
    const uint64_t section = static_cast<uint64_t>(it->end - it->begin) * sizeof(float);
    const uint64_t offset = static_cast<uint64_t>(lo - it->begin) * sizeof(float);
    const size_t bytes = static_cast<size_t>(hi - lo) * sizeof(float);
    for (size_t k = 0; k < outs.size(); ++k) {
      if (outs[k] == nullptr) continue;
      TROUPE_RETURN_IF_ERROR(file->ReadAt(k * section + offset, bytes, outs[k] + (lo - begin)));
    }
  }
  return absl::OkStatus();
}

CheckpointStore::CheckpointStore(CheckpointStoreOptions options)
    : options_(std::move(options)), fs_(options_.fs != nullptr ? options_.fs : PosixFileSystem()) {}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    CheckpointStoreOptions options) {
  if (options.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CheckpointStoreOptions.keep_last: expected >= 1, got ", options.keep_last));
  }
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("CheckpointStoreOptions.dir: expected a directory");
  }
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  std::unique_ptr<CheckpointStore> store(new CheckpointStore(std::move(options)));
  TROUPE_RETURN_IF_ERROR(store->fs_->CreateDir(store->options_.dir));
  return store;
}

std::string CheckpointStore::StepDir(int64_t step) const {
  return absl::StrCat(options_.dir, "/", kStepPrefix, step);
}

void CheckpointStore::Warn(const std::string& line) const {
  if (options_.warning) {
    options_.warning(line);
  } else {
    std::fprintf(stderr, "troupe checkpoint warning: %s\n", line.c_str());
  }
}

absl::StatusOr<ShardFileInfo> CheckpointStore::WriteShard(int64_t step, int index,
                                                          const ShardView& shard) {
  if (shard.end <= shard.begin || shard.begin < 0 || shard.params == nullptr ||
      (shard.adam_m == nullptr) != (shard.adam_v == nullptr) ||
      (shard.outer_global == nullptr) != (shard.outer_momentum == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteShard ", index,
                     ": expected a non-empty range with params, both or neither moments and "
                     "both or neither outer sections, got [",
                     shard.begin, ", ", shard.end, ")"));
  }
  TROUPE_RETURN_IF_ERROR(CheckFence(absl::StrCat("shard ", index, " of step ", step)));
  const std::string dir = StepDir(step);
  TROUPE_RETURN_IF_ERROR(fs_->CreateDir(dir));
  ShardFileInfo info;
  info.name = absl::StrFormat("shard-%05d.bin", index);
  info.begin = shard.begin;
  info.end = shard.end;
  const bool moments = shard.adam_m != nullptr;
  info.byte_size = ShardByteSize(shard.begin, shard.end, moments, shard.outer_global != nullptr);
  const std::string path = absl::StrCat(dir, "/", info.name);
  const std::string tmp = path + ".tmp";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs_->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  // A failed write (a full disk) leaves no partial file behind.
  auto fail = [&](absl::Status s) {
    file->reset();
    fs_->DeleteFile(tmp).IgnoreError();
    return s;
  };
  const size_t bytes = static_cast<size_t>(shard.end - shard.begin) * sizeof(float);
  uint32_t crc = 0;
  for (const float* section :
       {shard.params, shard.adam_m, shard.adam_v, shard.outer_global, shard.outer_momentum}) {
    if (section == nullptr) continue;
    if (absl::Status s = AppendWithCrc(file->get(), section, bytes, &crc); !s.ok()) return fail(s);
  }
  info.crc32c = crc;
  if (absl::Status s = (*file)->Sync(); !s.ok()) return fail(s);
  if (absl::Status s = (*file)->Close(); !s.ok()) return fail(s);
  if (absl::Status s = fs_->Rename(tmp, path); !s.ok()) return fail(s);
  return info;
}

absl::Status CheckpointStore::Commit(const CheckpointManifest& manifest) {
  const std::string dir = StepDir(manifest.step);
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestName);
  if (absl::Status s = ValidateManifest(manifest, manifest_path); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  TROUPE_RETURN_IF_ERROR(CheckFence(absl::StrCat("the commit of step ", manifest.step)));
  TROUPE_RETURN_IF_ERROR(WriteFileAtomically(fs_, manifest_path, EncodeManifest(manifest)));
  TROUPE_RETURN_IF_ERROR(fs_->SyncDir(dir));
  TROUPE_RETURN_IF_ERROR(fs_->SyncDir(options_.dir));
  // Chaos: the step's files and manifest are durable, LATEST still names the previous one.
  base::CrashPoint("checkpoint.publish");
  const std::string latest = absl::StrCat(options_.dir, "/", kLatestName);
  TROUPE_RETURN_IF_ERROR(
      WriteFileAtomically(fs_, latest, absl::StrCat(kStepPrefix, manifest.step, "\n")));
  TROUPE_RETURN_IF_ERROR(fs_->SyncDir(options_.dir));
  if (absl::Status s = Prune(manifest.step); !s.ok()) {
    // The checkpoint is committed; leftovers only cost disk space and are retried next time.
    Warn(absl::StrCat("pruning old checkpoints in ", options_.dir, " failed: ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::Write(const CheckpointManifest& meta,
                                    absl::Span<const ShardView> shards) {
  if (fs_->FileExists(absl::StrCat(StepDir(meta.step), "/", kManifestName))) {
    if (meta.step <= ReadLatestStep()) {
      // Rewriting files under a committed manifest could leave it naming a mix of old and new.
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint ", StepDir(meta.step), " is already committed"));
    }
    // Complete but never published (a crash before LATEST moved): start the directory afresh.
    TROUPE_RETURN_IF_ERROR(DeleteStepDir(meta.step));
  }
  CheckpointManifest manifest = meta;
  manifest.format_version = kCheckpointFormatVersion;
  manifest.shards.clear();
  for (size_t i = 0; i < shards.size(); ++i) {
    if ((shards[i].adam_m != nullptr) != manifest.has_moments) {
      return absl::InvalidArgumentError(
          absl::StrCat("Write: shard ", i, (manifest.has_moments ? " lacks" : " has"),
                       " optimizer moments, meta.has_moments says otherwise"));
    }
    if ((shards[i].outer_global != nullptr) != manifest.has_outer) {
      return absl::InvalidArgumentError(
          absl::StrCat("Write: shard ", i, (manifest.has_outer ? " lacks" : " has"),
                       " the outer state, meta.has_outer says otherwise"));
    }
  }
  // The shard files are written side by side: their page-cache copies and checksums spread over
  // the cores and their fsyncs overlap, where one after the other left the disk idle while the
  // next shard was copied. Each is still temp + fsync + rename; the manifest commits them all.
  std::vector<absl::StatusOr<ShardFileInfo>> infos(shards.size(),
                                                   absl::InternalError("shard not written"));
  std::atomic<size_t> next{0};
  auto write_some = [&] {
    for (size_t i; (i = next.fetch_add(1)) < shards.size();) {
      infos[i] = WriteShard(meta.step, static_cast<int>(i), shards[i]);
    }
  };
  std::vector<std::thread> helpers;
  const size_t threads = std::min<size_t>(shards.size(), kWriteThreads);
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(write_some);
  write_some();
  for (std::thread& t : helpers) t.join();
  for (absl::StatusOr<ShardFileInfo>& info : infos) {
    if (!info.ok()) return info.status();
    manifest.shards.push_back(*std::move(info));
  }
  return Commit(manifest);
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::ListSteps() {
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(options_.dir));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    int64_t step;
    if (ParseStepName(name, &step)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::Status CheckpointStore::DeleteStepDir(int64_t step) {
  const std::string dir = StepDir(step);
  TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(dir));
  // The manifest goes first: from then on the directory reads as incomplete.
  std::stable_partition(names.begin(), names.end(),
                        [](const std::string& n) { return n == kManifestName; });
  for (const std::string& name : names) {
    TROUPE_RETURN_IF_ERROR(fs_->DeleteFile(absl::StrCat(dir, "/", name)));
  }
  return fs_->DeleteDir(dir);
}

absl::Status CheckpointStore::Prune(int64_t latest_step) {
  TROUPE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps());
  // Committed checkpoints, newest first: at or before LATEST, with a manifest.
  std::vector<int64_t> committed;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (*it <= latest_step && fs_->FileExists(absl::StrCat(StepDir(*it), "/", kManifestName))) {
      committed.push_back(*it);
    }
  }
  if (committed.size() <= static_cast<size_t>(options_.keep_last)) return absl::OkStatus();
  const int64_t oldest_kept = committed[options_.keep_last - 1];
  for (int64_t step : steps) {
    if (step >= oldest_kept) break;
    TROUPE_RETURN_IF_ERROR(DeleteStepDir(step));
  }
  // No directory fsync: a deletion lost to a crash is simply redone by the next prune.
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> CheckpointStore::Load(int64_t step) {
  const std::string dir = StepDir(step);
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestName);
  absl::StatusOr<std::string> bytes = ReadSmallFile(fs_, manifest_path, kMaxManifestBytes);
  if (!bytes.ok()) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": unreadable (",
                                            bytes.status().ToString(), "); partial checkpoint?"));
  }
  absl::StatusOr<CheckpointManifest> manifest = DecodeManifest(*bytes, manifest_path);
  if (!manifest.ok()) return manifest.status();
  if (manifest->step != step) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": step ", manifest->step, ", expected ",
                                            step, " from its directory"));
  }
  std::string buffer;
  for (const ShardFileInfo& shard : manifest->shards) {
    const std::string path = absl::StrCat(dir, "/", shard.name);
    absl::StatusOr<std::unique_ptr<ReadableFile>> file = fs_->OpenForRead(path);
    if (!file.ok()) {
      return absl::DataLossError(
          absl::StrCat(path, ": unreadable (", file.status().ToString(), ")"));
    }
    if ((*file)->size() != shard.byte_size) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", (*file)->size(), " bytes, manifest says ", shard.byte_size,
                       (*file)->size() < shard.byte_size ? " (truncated)" : ""));
    }
    uint32_t crc = 0;
    buffer.resize(std::min<uint64_t>(kIoChunk, shard.byte_size));
    for (uint64_t done = 0; done < shard.byte_size; done += kIoChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kIoChunk, shard.byte_size - done));
      if (absl::Status s = (*file)->ReadAt(done, n, buffer.data()); !s.ok()) {
        return absl::DataLossError(absl::StrCat(path, ": ", s.ToString()));
      }
      crc = model::Crc32cExtend(crc, buffer.data(), n);
    }
    if (crc != shard.crc32c) {
      return absl::DataLossError(
          absl::StrCat(path, ": CRC32C ", crc, ", manifest says ", shard.crc32c));
    }
  }
  return Checkpoint(fs_, dir, *std::move(manifest));
}

absl::StatusOr<uint64_t> CheckpointStore::ReadFence() {
  const std::string path = absl::StrCat(options_.dir, "/", kFenceName);
  if (!fs_->FileExists(path)) return 0;
  TROUPE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(fs_, path, 64));
  uint64_t epoch;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &epoch)) {
    return absl::DataLossError(
        absl::StrCat(path, ": expected a lease epoch (a decimal number), got \"",
                     absl::CHexEscape(absl::StripAsciiWhitespace(text)), "\""));
  }
  return epoch;
}

absl::Status CheckpointStore::CheckFence(const std::string& what) {
  if (epoch_ == 0) return absl::OkStatus();
  TROUPE_ASSIGN_OR_RETURN(uint64_t fence, ReadFence());
  if (fence <= epoch_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("checkpoint store ", options_.dir, " refuses ", what, " from lease epoch ",
                   epoch_, ": epoch ", fence, " has claimed it since (", kFenceName, ")"));
}

absl::Status CheckpointStore::Claim(uint64_t epoch) {
  if (epoch == 0) return absl::InvalidArgumentError("Claim: expected a lease epoch > 0, got 0");
  TROUPE_ASSIGN_OR_RETURN(uint64_t fence, ReadFence());
  if (fence > epoch) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint store ", options_.dir,
                                                      " refuses lease epoch ", epoch, ": epoch ",
                                                      fence, " has claimed it (", kFenceName, ")"));
  }
  if (fence < epoch) {
    const std::string path = absl::StrCat(options_.dir, "/", kFenceName);
    TROUPE_RETURN_IF_ERROR(WriteFileAtomically(fs_, path, absl::StrCat(epoch, "\n")));
    TROUPE_RETURN_IF_ERROR(fs_->SyncDir(options_.dir));
  }
  epoch_ = epoch;
  return absl::OkStatus();
}

int64_t CheckpointStore::ReadLatestStep() {
  absl::StatusOr<std::string> text =
      ReadSmallFile(fs_, absl::StrCat(options_.dir, "/", kLatestName), 64);
  int64_t step;
  if (!text.ok() || !ParseStepName(absl::StripAsciiWhitespace(*text), &step)) return -1;
  return step;
}

absl::StatusOr<Checkpoint> CheckpointStore::LoadLatestValid() {
  TROUPE_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps());
  const std::string latest_path = absl::StrCat(options_.dir, "/", kLatestName);
  int64_t latest = -1;
  if (fs_->FileExists(latest_path)) {
    absl::StatusOr<std::string> text = ReadSmallFile(fs_, latest_path, 64);
    if (!text.ok() || !ParseStepName(absl::StripAsciiWhitespace(*text), &latest)) {
      latest = -1;
      Warn(absl::StrCat(latest_path, ": unreadable or not \"step-<n>\"; trying every checkpoint"));
    }
  } else if (!steps.empty()) {
    Warn(absl::StrCat(latest_path, ": missing; trying every checkpoint"));
  }
  std::vector<int64_t> candidates;
  if (latest >= 0) candidates.push_back(latest);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (latest < 0 || *it < latest) candidates.push_back(*it);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    absl::StatusOr<Checkpoint> ckpt = Load(candidates[i]);
    if (ckpt.ok()) return ckpt;
    Warn(absl::StrCat(
        "skipping checkpoint ", StepDir(candidates[i]), ": ", ckpt.status().message(),
        i + 1 < candidates.size() ? "; falling back to an older one" : "; no older one left"));
  }
  return absl::NotFoundError(
      absl::StrCat("no valid checkpoint in ", options_.dir, " (", candidates.size(), " skipped)"));
}

}  // namespace troupe::train
