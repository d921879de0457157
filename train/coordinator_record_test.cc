// The coordinator's record: round trip, durability through the fake file system, and damage
// reported as DataLoss naming the file.
#include "troupe/train/coordinator_record.h"

#include <gtest/gtest.h>

#include "troupe/train/fake_file_system.h"

namespace troupe::train {
namespace {

CoordinatorRecord Sample() {
  CoordinatorRecord r;
  r.committed = 17;
  r.generation = 5;
  r.steps_lost = 2;
  r.awaiting_recovery = true;
  r.fired = {0, 3};
  r.active = {"n0/w0", "n2/w0", "n1/w0"};
  r.buddy = 2;
  r.dead = {"n3/w0"};
  return r;
}

TEST(CoordinatorRecordTest, RoundTripsEveryField) {
  absl::StatusOr<CoordinatorRecord> back =
      DecodeCoordinatorRecord(EncodeCoordinatorRecord(Sample()), "job/coordinator.state");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, Sample());
}

TEST(CoordinatorRecordTest, MissingRecordIsNotAnError) {
  FakeFileSystem fs;
  absl::StatusOr<std::optional<CoordinatorRecord>> r =
      LoadCoordinatorRecord(&fs, "job/coordinator.state");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
}

TEST(CoordinatorRecordTest, SavedRecordSurvivesACrashAndReplacesTheOldOne) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDir("job").ok());
  CoordinatorRecord first = Sample();
  first.committed = 3;
  ASSERT_TRUE(SaveCoordinatorRecord(&fs, "job/coordinator.state", first).ok());
  ASSERT_TRUE(SaveCoordinatorRecord(&fs, "job/coordinator.state", Sample()).ok());
  fs.Reboot(/*lose_unsynced=*/true);  // only fsynced data and directory entries survive
  absl::StatusOr<std::optional<CoordinatorRecord>> r =
      LoadCoordinatorRecord(&fs, "job/coordinator.state");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, Sample());
}

TEST(CoordinatorRecordTest, EveryDamagedByteIsDataLossNamingTheFile) {
  const std::string good = EncodeCoordinatorRecord(Sample());
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x20;
    absl::StatusOr<CoordinatorRecord> r = DecodeCoordinatorRecord(bad, "job/coordinator.state");
    ASSERT_FALSE(r.ok()) << "byte " << i;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("coordinator record job/coordinator.state"),
              std::string::npos)
        << r.status();
  }
  for (size_t n : {size_t{0}, size_t{5}, good.size() - 1}) {
    absl::StatusOr<CoordinatorRecord> r = DecodeCoordinatorRecord(good.substr(0, n), "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "truncated to " << n;
  }
}

TEST(CoordinatorRecordTest, ABuddyOffsetOutsideTheActiveWorldIsDataLoss) {
  for (int32_t buddy : {0, 3, -1}) {
    CoordinatorRecord r = Sample();
    r.buddy = buddy;
    absl::StatusOr<CoordinatorRecord> back =
        DecodeCoordinatorRecord(EncodeCoordinatorRecord(r), "f");
    ASSERT_FALSE(back.ok()) << "buddy " << buddy;
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(back.status().message().find("buddy: expected 1 to 2 for 3 active workers"),
              std::string::npos)
        << back.status();
  }
}

}  // namespace
}  // namespace troupe::train
