#include "troupe/scheduler/elastic.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::scheduler {
namespace {

using Action = ScaleDecision::Action;

ElasticPolicy Make(int min, int max, int target) {
  ElasticOptions o;
  o.min_workers = min;
  o.max_workers = max;
  o.target_workers = target;
  absl::StatusOr<ElasticPolicy> p = ElasticPolicy::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

TEST(ElasticPolicyTest, GrowsToTargetAndNoFurther) {
  ElasticPolicy p = Make(2, 8, 6);
  ScaleDecision d = p.OnJoin("n1", 1);
  EXPECT_EQ(d.action, Action::kKeep);  // below min, nothing was running
  EXPECT_EQ(d.world_size, 0);
  d = p.OnJoin("n2", 4);
  EXPECT_EQ(d.action, Action::kResize);
  EXPECT_EQ(d.world_size, 5);
  d = p.OnJoin("n3", 4);
  EXPECT_EQ(d.action, Action::kResize);
  EXPECT_EQ(d.world_size, 6);  // target
  d = p.OnJoin("n4", 4);
  EXPECT_EQ(d.action, Action::kKeep);
  EXPECT_EQ(p.world_size(), 6);
}

TEST(ElasticPolicyTest, DrainShrinksBeforeTheNodeLeaves) {
  ElasticPolicy p = Make(2, 8, 8);
  p.OnJoin("n1", 4);
  EXPECT_EQ(p.OnJoin("n2", 4).world_size, 8);
  ScaleDecision d = p.OnDrain("n2");
  EXPECT_EQ(d.action, Action::kResize);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_THAT(d.reason, ::testing::HasSubstr("drain n2"));
  d = p.OnLeave("n2");  // already accounted for
  EXPECT_EQ(d.action, Action::kKeep);
  EXPECT_EQ(d.world_size, 4);
}

TEST(ElasticPolicyTest, PausesBelowMinAndResumes) {
  ElasticPolicy p = Make(4, 8, 8);
  EXPECT_EQ(p.OnJoin("n1", 4).world_size, 4);
  ScaleDecision d = p.OnLeave("n1");
  EXPECT_EQ(d.action, Action::kPause);
  EXPECT_EQ(d.world_size, 0);
  EXPECT_THAT(d.reason, ::testing::HasSubstr("min_workers 4"));
  d = p.OnJoin("n2", 8);
  EXPECT_EQ(d.action, Action::kResize);
  EXPECT_EQ(d.world_size, 8);
}

TEST(ElasticPolicyTest, TargetIsClampedToMinMax) {
  ElasticPolicy p = Make(2, 4, 4);
  p.OnJoin("n1", 16);
  EXPECT_EQ(p.OnTargetChange(100).world_size, 4);
  EXPECT_EQ(p.OnTargetChange(3).world_size, 3);
  EXPECT_EQ(p.OnTargetChange(1).world_size, 2);
  EXPECT_THAT(p.DebugString(), ::testing::HasSubstr("world=2"));
}

TEST(ElasticPolicyTest, RejectsBadBounds) {
  ElasticOptions o;
  o.min_workers = 4;
  o.max_workers = 2;
  EXPECT_EQ(ElasticPolicy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.min_workers = 0;
  EXPECT_EQ(ElasticPolicy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::scheduler
