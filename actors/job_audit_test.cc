// ExactlyOnceDefects (job_audit.h) on records written by hand: a clean job, and each kind of
// defect named with its step and generation.
#include "troupe/actors/job_audit.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace troupe::actors {
namespace {

class JobAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/troupe_job_audit_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/serve");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& file, const std::string& text) {
    std::ofstream(dir_ + "/" + file, std::ios::app) << text;
  }
  std::string dir_;
};

TEST_F(JobAuditTest, ACleanJobHasNoDefect) {
  // Two ranks, two microbatches each of 4, steps 0 and 1; step 1 retried in generation 2 after
  // a failed attempt in generation 1 (served, never committed: not a defect).
  Write("serve/n0_w0.log", "0 0 1\n0 1 1\n1 0 1\n1 0 2\n1 1 2\n");
  Write("serve/n1_w0.log", "0 2 1\n0 3 1\n1 2 2\n1 3 2\n");
  Write("commits.log", "0 1\n1 2\n");
  EXPECT_EQ(ExactlyOnceDefects(dir_, 2, 4), "");
}

TEST_F(JobAuditTest, EachDefectIsNamed) {
  Write("serve/n0_w0.log", "0 0 1\n0 1 1\n0 1 1\n1 0 1\n");  // step 0's microbatch 1 twice
  Write("commits.log", "0 1\n1 1\n1 1\n");                   // step 1 committed twice
  const std::string d = ExactlyOnceDefects(dir_, 3, 2);
  EXPECT_NE(d.find("step 0 generation 1: 3 of 2 microbatches"), std::string::npos) << d;
  EXPECT_NE(d.find("1 steps committed again (1 (2 times)), but the job lost 0"), std::string::npos)
      << d;
  EXPECT_NE(d.find("step 2 never committed"), std::string::npos) << d;
}

// A rollback to step 1's checkpoint re-runs step 1 in generation 2: committed twice, each time
// served once, as many re-commits as the job says it lost.
TEST_F(JobAuditTest, StepsReRunAfterARollbackAreTheStepsLost) {
  Write("serve/n0_w0.log", "0 0 1\n0 1 1\n1 0 1\n1 1 1\n1 0 2\n1 1 2\n");
  Write("commits.log", "0 1\n1 1\n1 2\n");
  EXPECT_EQ(ExactlyOnceDefects(dir_, 2, 2, /*steps_lost=*/1), "");
  EXPECT_NE(ExactlyOnceDefects(dir_, 2, 2, /*steps_lost=*/0).find("1 steps committed again"),
            std::string::npos);
}

TEST_F(JobAuditTest, MissingRecordsAreADefect) {
  EXPECT_NE(ExactlyOnceDefects(dir_, 1, 2).find("commits.log: cannot be read"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors
