// placement.h's enums as text, and Placement::Parse, the where-string edge.
#include "troupe/runtime/placement.h"

#include "absl/strings/str_cat.h"
#include "internal/enum_text.h"

namespace troupe::runtime {

const char* Name(PlacementStrategy strategy) {
  switch (strategy) {
    case PlacementStrategy::kPack:
      return "pack";
    case PlacementStrategy::kSpread:
      return "spread";
  }
  return "?";
}

const char* Name(SpotPreference spot) {
  switch (spot) {
    case SpotPreference::kNone:
      return "none";
    case SpotPreference::kPrefer:
      return "prefer";
    case SpotPreference::kAvoid:
      return "avoid";
  }
  return "?";
}

const char* Name(GroupStrategy strategy) {
  switch (strategy) {
    case GroupStrategy::kPack:
      return "pack";
    case GroupStrategy::kSpread:
      return "spread";
    case GroupStrategy::kStrictPack:
      return "strict_pack";
    case GroupStrategy::kStrictSpread:
      return "strict_spread";
  }
  return "?";
}

absl::StatusOr<PlacementStrategy> ParsePlacementStrategy(const std::string& text) {
  constexpr PlacementStrategy kAll[] = {PlacementStrategy::kPack, PlacementStrategy::kSpread};
  return internal::ParseEnum("placement strategy", text, kAll);
}

absl::StatusOr<SpotPreference> ParseSpotPreference(const std::string& text) {
  if (text.empty()) return SpotPreference::kNone;  // the form Placement::spot had as a string
  constexpr SpotPreference kAll[] = {SpotPreference::kNone, SpotPreference::kPrefer,
                                     SpotPreference::kAvoid};
  return internal::ParseEnum("placement spot", text, kAll);
}

absl::StatusOr<GroupStrategy> ParseGroupStrategy(const std::string& text) {
  constexpr GroupStrategy kAll[] = {GroupStrategy::kPack, GroupStrategy::kSpread,
                                    GroupStrategy::kStrictPack, GroupStrategy::kStrictSpread};
  return internal::ParseEnum("placement group strategy", text, kAll);
}

absl::StatusOr<Placement> Placement::Parse(const std::string& where) {
  Placement p;
  if (where.empty() || where == "any") return p;
  if (where.rfind("node=", 0) == 0) {
    p.node = where.substr(5);
  } else if (where.rfind("worker=", 0) == 0) {
    p.worker = where.substr(7);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement '", where, "': expected '', 'any', 'node=<name>' or 'worker=<id>'"));
  }
  return p;
}

}  // namespace troupe::runtime
