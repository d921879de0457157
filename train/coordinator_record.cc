#include "troupe/train/coordinator_record.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator.capnp.h"
#include "envelope.h"
#include "troupe/base/status_macros.h"

namespace troupe::train {
namespace {

constexpr char kMagic[] = "TRPCOREC";
constexpr size_t kMaxRecordBytes = 16 << 20;
constexpr size_t kMaxNames = 1 << 16;

absl::string_view Magic() { return absl::string_view(kMagic, 8); }

}  // namespace

std::string EncodeCoordinatorRecord(const CoordinatorRecord& r) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<schema::CoordinatorRecord>();
  root.setFormatVersion(kCoordinatorRecordVersion);
  root.setCommitted(r.committed);
  root.setGeneration(r.generation);
  root.setStepsLost(r.steps_lost);
  root.setAwaitingRecovery(r.awaiting_recovery);
  auto fired = root.initFired(static_cast<unsigned>(r.fired.size()));
  unsigned i = 0;
  for (int32_t f : r.fired) fired.set(i++, f);
  auto active = root.initActive(static_cast<unsigned>(r.active.size()));
  for (unsigned k = 0; k < r.active.size(); ++k) active.set(k, r.active[k]);
  root.setBuddy(r.buddy);
  auto dead = root.initDead(static_cast<unsigned>(r.dead.size()));
  i = 0;
  for (const std::string& d : r.dead) dead.set(i++, d);
  return SealMessage(Magic(), builder);
}

absl::StatusOr<CoordinatorRecord> DecodeCoordinatorRecord(absl::string_view bytes,
                                                          const std::string& file) {
  const std::string what = absl::StrCat("coordinator record ", file);
  TROUPE_ASSIGN_OR_RETURN(kj::Array<capnp::word> words,
                          UnsealMessage(bytes, Magic(), kMaxRecordBytes, what));
  CoordinatorRecord r;
  std::string error;
  kj::Maybe<kj::Exception> exception = kj::runCatchingExceptions([&]() {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = words.size() + 64;
    options.nestingLimit = 4;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    auto root = reader.getRoot<schema::CoordinatorRecord>();
    if (root.getFormatVersion() != kCoordinatorRecordVersion) {
      error = absl::StrCat("format version ", root.getFormatVersion(), ", expected ",
                           kCoordinatorRecordVersion);
      return;
    }
    if (root.getActive().size() > kMaxNames || root.getDead().size() > kMaxNames ||
        root.getFired().size() > kMaxNames) {
      error = absl::StrCat("more than ", kMaxNames, " entries in a list");
      return;
    }
    r.committed = root.getCommitted();
    r.generation = root.getGeneration();
    r.steps_lost = root.getStepsLost();
    r.awaiting_recovery = root.getAwaitingRecovery();
    for (int32_t f : root.getFired()) r.fired.insert(f);
    for (auto t : root.getActive()) r.active.emplace_back(t.cStr(), t.size());
    r.buddy = root.getBuddy();
    for (auto t : root.getDead()) r.dead.emplace(t.cStr(), t.size());
  });
  KJ_IF_MAYBE (e, exception) {
    return absl::DataLossError(
        absl::StrCat(what, ": undecodable message: ", e->getDescription().cStr()));
  }
  if (!error.empty()) return absl::DataLossError(absl::StrCat(what, ": ", error));
  if (r.committed < 0 || r.steps_lost < 0) {
    return absl::DataLossError(absl::StrCat(what, ": committed ", r.committed, ", steps_lost ",
                                            r.steps_lost, ", expected both >= 0"));
  }
  const int world = static_cast<int>(r.active.size());
  if (r.buddy < 1 || r.buddy >= std::max(2, world)) {
    return absl::DataLossError(absl::StrCat(what, ": buddy: expected 1 to ", std::max(1, world - 1),
                                            " for ", world, " active workers, got ", r.buddy));
  }
  return r;
}

absl::Status SaveCoordinatorRecord(FileSystem* fs, const std::string& path,
                                   const CoordinatorRecord& record) {
  TROUPE_RETURN_IF_ERROR(WriteFileAtomically(fs, path, EncodeCoordinatorRecord(record)));
  const size_t slash = path.rfind('/');
  return fs->SyncDir(slash == std::string::npos ? "." : path.substr(0, slash));
}

absl::StatusOr<std::optional<CoordinatorRecord>> LoadCoordinatorRecord(FileSystem* fs,
                                                                       const std::string& path) {
  if (!fs->FileExists(path)) return std::optional<CoordinatorRecord>();
  TROUPE_ASSIGN_OR_RETURN(std::string bytes, ReadSmallFile(fs, path, kMaxRecordBytes));
  TROUPE_ASSIGN_OR_RETURN(CoordinatorRecord r, DecodeCoordinatorRecord(bytes, path));
  return std::optional<CoordinatorRecord>(std::move(r));
}

}  // namespace troupe::train
