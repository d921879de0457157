#include "troupe/train/fake_file_system.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "troupe/base/status_macros.h"

namespace troupe::train {
namespace {

absl::Status WriteFile(FileSystem& fs, const std::string& path, const std::string& bytes,
                       bool sync) {
  TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, fs.NewWritableFile(path));
  TROUPE_RETURN_IF_ERROR(f->Append(bytes.data(), bytes.size()));
  if (sync) {
    TROUPE_RETURN_IF_ERROR(f->Sync());
  }
  return f->Close();
}

std::string Read(FileSystem& fs, const std::string& path) {
  absl::StatusOr<std::string> s = ReadSmallFile(&fs, path, 1 << 20);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

TEST(FakeFileSystemTest, PowerCutKeepsOnlySyncedDataAndSyncedEntries) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDir("root").ok());
  ASSERT_TRUE(fs.CreateDir("root/d").ok());
  ASSERT_TRUE(WriteFile(fs, "root/d/synced", "abc", /*sync=*/true).ok());
  ASSERT_TRUE(WriteFile(fs, "root/d/unsynced", "xyz", /*sync=*/false).ok());
  ASSERT_TRUE(fs.SyncDir("root/d").ok());
  // root/d's own entry is not durable yet: everything under it is lost.
  fs.Reboot(/*lose_unsynced=*/true);
  EXPECT_FALSE(fs.FileExists("root/d"));
  EXPECT_TRUE(fs.FileExists("root"));

  ASSERT_TRUE(fs.CreateDir("root/d").ok());
  ASSERT_TRUE(fs.SyncDir("root").ok());
  ASSERT_TRUE(WriteFile(fs, "root/d/synced", "abc", true).ok());
  ASSERT_TRUE(WriteFile(fs, "root/d/unsynced", "xyz", false).ok());
  ASSERT_TRUE(WriteFile(fs, "root/d/noentry", "q", true).ok());
  ASSERT_TRUE(fs.SyncDir("root/d").ok());
  ASSERT_TRUE(WriteFile(fs, "root/d/late", "q", true).ok());  // after the directory fsync
  fs.Reboot(true);
  EXPECT_EQ(Read(fs, "root/d/synced"), "abc");
  EXPECT_EQ(Read(fs, "root/d/unsynced"), "");  // entry survived, data did not
  EXPECT_TRUE(fs.FileExists("root/d/noentry"));
  EXPECT_FALSE(fs.FileExists("root/d/late"));
}

TEST(FakeFileSystemTest, RenameIsDurableOnlyAfterDirSync) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDir("r").ok());
  ASSERT_TRUE(WriteFile(fs, "r/a.tmp", "new", true).ok());
  ASSERT_TRUE(fs.SyncDir("r").ok());
  ASSERT_TRUE(fs.Rename("r/a.tmp", "r/a").ok());
  fs.Reboot(true);
  EXPECT_TRUE(fs.FileExists("r/a.tmp"));
  EXPECT_FALSE(fs.FileExists("r/a"));
  ASSERT_TRUE(fs.Rename("r/a.tmp", "r/a").ok());
  ASSERT_TRUE(fs.SyncDir("r").ok());
  fs.Reboot(true);
  EXPECT_EQ(Read(fs, "r/a"), "new");
  EXPECT_FALSE(fs.FileExists("r/a.tmp"));
}

TEST(FakeFileSystemTest, CrashRefusesLaterCallsUntilReboot) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDir("r").ok());  // call 1
  fs.InjectAt(3, FakeFileSystem::Fault::kCrash);
  absl::StatusOr<std::unique_ptr<WritableFile>> f = fs.NewWritableFile("r/x");  // call 2
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->Append("hi", 2).code(), absl::StatusCode::kAborted);  // call 3: crash
  EXPECT_TRUE(fs.crashed());
  EXPECT_EQ(fs.SyncDir("r").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(fs.mutating_calls(), 3);
  EXPECT_EQ(fs.call_log().back(), "Append r/x");
  fs.Reboot(/*lose_unsynced=*/false);  // a killed process: the kernel kept everything
  EXPECT_FALSE(fs.crashed());
  EXPECT_TRUE(fs.FileExists("r/x"));
  EXPECT_TRUE(fs.SyncDir("r").ok());
}

TEST(FakeFileSystemTest, FailIsOneShot) {
  FakeFileSystem fs;
  fs.InjectAt(2, FakeFileSystem::Fault::kFail);
  ASSERT_TRUE(fs.CreateDir("r").ok());
  EXPECT_EQ(fs.CreateDir("r/a").code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(fs.crashed());
  EXPECT_TRUE(fs.CreateDir("r/a").ok());
  EXPECT_TRUE(fs.FileExists("r/a"));
}

TEST(FakeFileSystemTest, ListDeleteAndCorruptionHelpers) {
  FakeFileSystem fs;
  ASSERT_TRUE(fs.CreateDir("r").ok());
  ASSERT_TRUE(fs.CreateDir("r/d").ok());
  ASSERT_TRUE(WriteFile(fs, "r/d/f", "hello", true).ok());
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir("r");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"d"});
  EXPECT_EQ(fs.DeleteDir("r/d").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(fs.FlipByte("r/d/f", 0).ok());
  EXPECT_NE(Read(fs, "r/d/f"), "hello");
  ASSERT_TRUE(fs.Truncate("r/d/f", 2).ok());
  EXPECT_EQ(Read(fs, "r/d/f").size(), 2u);
  ASSERT_TRUE(fs.DeleteFile("r/d/f").ok());
  ASSERT_TRUE(fs.DeleteDir("r/d").ok());
  EXPECT_TRUE(fs.ListDir("r")->empty());
}

}  // namespace
}  // namespace troupe::train
