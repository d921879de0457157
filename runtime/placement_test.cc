// placement.h's enums: text round trips and the errors at the text edge; Placement::Parse.
#include "troupe/runtime/placement.h"

#include <gtest/gtest.h>

#include <vector>

#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

namespace troupe::runtime {
namespace {

TEST(PlacementNamesTest, StrategyRoundTrips) {
  for (PlacementStrategy s : {PlacementStrategy::kPack, PlacementStrategy::kSpread}) {
    absl::StatusOr<PlacementStrategy> back = ParsePlacementStrategy(Name(s));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, s) << Name(s);
  }
  EXPECT_STREQ(Name(PlacementStrategy::kPack), "pack");
  EXPECT_STREQ(Name(PlacementStrategy::kSpread), "spread");
}

TEST(PlacementNamesTest, SpotRoundTripsAndTakesTheEmptyText) {
  const std::vector<std::pair<SpotPreference, std::string>> all = {
      {SpotPreference::kNone, "none"},
      {SpotPreference::kPrefer, "prefer"},
      {SpotPreference::kAvoid, "avoid"}};
  for (const auto& [s, text] : all) {
    EXPECT_EQ(Name(s), text);
    absl::StatusOr<SpotPreference> back = ParseSpotPreference(text);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, s) << text;
  }
  absl::StatusOr<SpotPreference> empty = ParseSpotPreference("");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, SpotPreference::kNone);
}

TEST(PlacementNamesTest, GroupStrategyRoundTrips) {
  const std::vector<std::pair<GroupStrategy, std::string>> all = {
      {GroupStrategy::kPack, "pack"},
      {GroupStrategy::kSpread, "spread"},
      {GroupStrategy::kStrictPack, "strict_pack"},
      {GroupStrategy::kStrictSpread, "strict_spread"}};
  for (const auto& [s, text] : all) {
    EXPECT_EQ(Name(s), text);
    absl::StatusOr<GroupStrategy> back = ParseGroupStrategy(text);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, s) << text;
  }
}

TEST(PlacementNamesTest, UnknownNamesNameTheFieldTheChoicesAndTheText) {
  absl::StatusOr<PlacementStrategy> s = ParsePlacementStrategy("strict_pack");
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "placement strategy: expected pack or spread, got 'strict_pack'");

  absl::StatusOr<SpotPreference> spot = ParseSpotPreference("yes");
  ASSERT_EQ(spot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spot.status().message(), "placement spot: expected none, prefer or avoid, got 'yes'");

  absl::StatusOr<GroupStrategy> g = ParseGroupStrategy("STRICT_SPREAD");
  ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.status().message(),
            "placement group strategy: expected pack, spread, strict_pack or strict_spread, got "
            "'STRICT_SPREAD'");

  EXPECT_STREQ(Name(static_cast<GroupStrategy>(9)), "?");
}

TEST(PlacementTest, ParseReadsWhereStrings) {
  absl::StatusOr<Placement> any = Placement::Parse("any");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->strategy, PlacementStrategy::kPack);
  EXPECT_EQ(any->spot, SpotPreference::kNone);
  EXPECT_EQ(Placement::Parse("node=n1")->node, "n1");
  EXPECT_EQ(Placement::Parse("worker=n1/w0")->worker, "n1/w0");
  EXPECT_EQ(Placement::Parse("zone=a").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlacementTest, EnumsSurviveCafSerialization) {
  Placement p;
  p.worker = "n1/w0";
  p.strategy = PlacementStrategy::kSpread;
  p.spot = SpotPreference::kAvoid;
  p.bundle = 2;
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  ASSERT_FALSE(sink(p));
  Placement back;
  caf::binary_deserializer source{nullptr, buf};
  ASSERT_FALSE(source(back));
  EXPECT_EQ(back.worker, "n1/w0");
  EXPECT_EQ(back.strategy, PlacementStrategy::kSpread);
  EXPECT_EQ(back.spot, SpotPreference::kAvoid);
  EXPECT_EQ(back.bundle, 2);
}

}  // namespace
}  // namespace troupe::runtime
