// Small builders for the scheduler's unit tests.
#ifndef TROUPE_SCHEDULER_TEST_UTIL_H_
#define TROUPE_SCHEDULER_TEST_UTIL_H_

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "troupe/scheduler/scheduler.h"

namespace troupe::scheduler::testing {

inline NodeSpec MakeNode(std::string name, ResourceMap resources, LabelMap labels = {}) {
  return NodeSpec{std::move(name), std::move(resources), std::move(labels)};
}

inline ActorRequest MakeActor(std::string id, ResourceMap demands,
                              Strategy strategy = Strategy::kPack) {
  ActorRequest a;
  a.actor = std::move(id);
  a.demands = std::move(demands);
  a.strategy = strategy;
  return a;
}

inline PlacementGroupRequest MakeGroup(std::string id, Strategy strategy, int bundles,
                                       ResourceMap each, std::string domain_key = "") {
  PlacementGroupRequest g;
  g.group = std::move(id);
  g.strategy = strategy;
  g.bundles.assign(bundles, each);
  g.domain_key = std::move(domain_key);
  return g;
}

// Places and returns the node, failing the test when it is not placed.
inline std::string MustPlace(Scheduler& s, const ActorRequest& a) {
  absl::StatusOr<ActorDecision> d = s.PlaceActor(a);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return "";
  EXPECT_TRUE(d->placed()) << d->unschedulable->reason;
  return d->node;
}

inline double Free(const Scheduler& s, const std::string& node, const std::string& resource) {
  auto v = s.Node(node);
  EXPECT_TRUE(v.has_value()) << node;
  return v ? v->free.at(resource) : -1;
}

}  // namespace troupe::scheduler::testing

#endif  // TROUPE_SCHEDULER_TEST_UTIL_H_
