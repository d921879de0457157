// coordinator_record.h — the coordinator's committed-step record on disk (the coordinator actor
// keeps it; CoordinatorCore decides what it holds).
//
// Written before any rank is told to commit or to start a generation, and before a fault is
// carried out, so a restarted coordinator resumes where the killed one stopped (and never fires
// a fault twice). Durable and atomic: temp file, fsync, rename, directory fsync, through the
// FileSystem seam; versioned and checksummed (envelope.h). A damaged record is DataLoss naming the
// file and the damage, never a silent restart from step 0.
//
//   RETURN_IF_ERROR(SaveCoordinatorRecord(fs, "job/coordinator.state", record));
//   absl::StatusOr<std::optional<CoordinatorRecord>> back =
//       LoadCoordinatorRecord(fs, "job/coordinator.state");   // nullopt: no record yet
#ifndef TROUPE_TRAIN_COORDINATOR_RECORD_H_
#define TROUPE_TRAIN_COORDINATOR_RECORD_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "troupe/train/coordinator_core.h"
#include "troupe/train/file_system.h"

namespace troupe::train {

inline constexpr uint32_t kCoordinatorRecordVersion = 1;

std::string EncodeCoordinatorRecord(const CoordinatorRecord& record);
[[nodiscard]] absl::StatusOr<CoordinatorRecord> DecodeCoordinatorRecord(absl::string_view bytes,
                                                                        const std::string& file);

[[nodiscard]] absl::Status SaveCoordinatorRecord(FileSystem* fs, const std::string& path,
                                                 const CoordinatorRecord& record);
// nullopt when there is no record at `path`.
[[nodiscard]] absl::StatusOr<std::optional<CoordinatorRecord>> LoadCoordinatorRecord(
    FileSystem* fs, const std::string& path);

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_COORDINATOR_RECORD_H_
