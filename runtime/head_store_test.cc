#include "internal/head_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "troupe/runtime/local_etcd.h"

namespace troupe::runtime::internal {
namespace {

class HeadStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe_head_store_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/head.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, path_;
};

MemberInfo Node(const std::string& name) {
  return MemberInfo{name,        MemberKind::kNode, name,    MemberState::kAlive, 0, "cpu=2",
                    "spot=true", "10.0.0.7",        "host-7"};
}

TEST_F(HeadStoreTest, EachOpeningClaimsANewEpochAndTheStateOutlivesTheProcess) {
  {
    auto s = OpenSqliteHeadStore(path_);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->epoch(), 1u);
    ASSERT_TRUE((*s)->PutMembership(40, {}).ok());
    MemberInfo w{"n1/w0", MemberKind::kWorker, "n1",    MemberState::kAlive, 4242, "",
                 "",      "10.0.0.7",          "host-7"};
    ASSERT_TRUE((*s)->PutMembership(41, {Node("n1"), w}).ok());
    w.state = MemberState::kDead;  // a later write of the same member replaces it
    ASSERT_TRUE((*s)->PutMembership(41, {w}).ok());
    ASSERT_TRUE((*s)->PutActor({"job.coordinator", "n1/w0", 3}).ok());
    ASSERT_TRUE((*s)->PutActor({"job.rank.0", "n1/w0", 1}).ok());
    ASSERT_TRUE((*s)->RemoveActor("job.rank.0").ok());
    ASSERT_TRUE((*s)->PutJob("job-1", R"({"state": "pending"})").ok());
    ASSERT_TRUE((*s)->PutJob("job-1", R"({"state": "running"})").ok());
  }
  auto s = OpenSqliteHeadStore(path_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->epoch(), 2u);
  absl::StatusOr<HeadStore::State> state = (*s)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->generation, 41u);
  ASSERT_EQ(state->members.size(), 2u);
  EXPECT_EQ(state->members[0].id, "n1");
  EXPECT_EQ(state->members[0].labels, "spot=true");
  EXPECT_EQ(state->members[1].id, "n1/w0");
  EXPECT_EQ(state->members[1].state, MemberState::kDead);
  EXPECT_EQ(state->members[1].pid, 4242);
  EXPECT_EQ(state->actors, (std::vector<StoredActor>{{"job.coordinator", "n1/w0", 3}}));
  using Jobs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(state->jobs, (Jobs{{"job-1", R"({"state": "running"})"}}));
}

TEST_F(HeadStoreTest, AHeadThatAnotherClaimedTheStoreFromIsRefusedItsWrites) {
  auto old_head = OpenSqliteHeadStore(path_);
  ASSERT_TRUE(old_head.ok()) << old_head.status();
  ASSERT_TRUE((*old_head)->PutMembership(7, {}).ok());
  auto new_head = OpenSqliteHeadStore(path_);  // a standby, or the restarted head
  ASSERT_TRUE(new_head.ok()) << new_head.status();
  absl::Status refused = (*old_head)->PutMembership(8, {Node("stale")});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), path_ +
                                   ": this head's epoch 1 was fenced: a head of epoch 2 has "
                                   "claimed the store since; its writes are refused");
  EXPECT_FALSE((*old_head)->PutMembership(8, {}).ok());
  EXPECT_FALSE((*old_head)->PutJob("job-1", "{}").ok());
  ASSERT_TRUE((*new_head)->PutMembership(7, {Node("fresh")}).ok());
  absl::StatusOr<HeadStore::State> state = (*new_head)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->generation, 7u);
  ASSERT_EQ(state->members.size(), 1u);
  EXPECT_EQ(state->members[0].id, "fresh");
}

// A join of hundreds is written in a few transactions (etcd takes at most 128 operations in one):
// every member arrives, and the generation.
TEST_F(HeadStoreTest, OnEtcdAGroupOfMoreMembersThanOneTransactionTakesIsWrittenWhole) {
  testing::LocalEtcd etcd(dir_);
  ASSERT_TRUE(etcd.ready()) << etcd.log();
  const std::string store = etcd.store("/group");  // etcd://HOST:PORT/group
  EtcdStoreOptions o;
  o.endpoint = "http://" + store.substr(7, store.find('/', 7) - 7);
  o.prefix = "/group";
  o.address = "head-a";
  auto s = OpenEtcdHeadStore(o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<MemberInfo> members;
  for (int i = 0; i < 2 * static_cast<int>(kEtcdMembersPerTxn) + 17; ++i) {
    members.push_back(Node("n" + std::to_string(1000 + i)));
  }
  ASSERT_TRUE((*s)->PutMembership(9, members).ok());
  members.back().state = MemberState::kDead;
  ASSERT_TRUE((*s)->PutMembership(10, {members.back()}).ok());
  absl::StatusOr<HeadStore::State> state = (*s)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->generation, 10u);
  ASSERT_EQ(state->members.size(), members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(state->members[i].id, members[i].id);
    EXPECT_EQ(state->members[i].state, members[i].state) << members[i].id;
  }
}

TEST_F(HeadStoreTest, AFileThatIsNoStoreAndAPathThatCannotBeOpenedAreErrorsNamingThem) {
  std::ofstream(path_) << "this is a job spec, not a database\n" << std::string(4096, 'x');
  auto s = OpenSqliteHeadStore(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(path_ + ": not a troupe head store"), std::string::npos)
      << s.status();
  auto missing = OpenSqliteHeadStore(dir_ + "/no/such/dir/head.db");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir_ + "/no/such/dir/head.db: cannot open the head's "
                                                   "store"),
            std::string::npos)
      << missing.status();
}

}  // namespace
}  // namespace troupe::runtime::internal
