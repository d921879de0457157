// coordinator_bootstrap.h — private to actors/: the collectives' bootstrap of a rank, served by
// its job's coordinator (rank_actor.cc).
#ifndef TROUPE_ACTORS_COORDINATOR_BOOTSTRAP_H_
#define TROUPE_ACTORS_COORDINATOR_BOOTSTRAP_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "protocol.h"
#include "troupe/base/clock.h"
#include "troupe/base/status_macros.h"
#include "troupe/collectives/bootstrap.h"

namespace troupe::actors::internal {

// Bootstrap keys live in the coordinator (put/get requests); a lookup polls until the key is
// there, its deadline passes, or the generation it serves was aborted.
class CoordinatorBootstrap : public collectives::Bootstrap {
 public:
  CoordinatorBootstrap(caf::actor_system& sys, caf::actor kv, uint64_t gen,
                       const std::atomic<uint64_t>* aborted_below, absl::Duration rpc)
      : sys_(sys),
        kv_(std::move(kv)),
        gen_(gen),
        aborted_below_(aborted_below),
        rpc_(absl::ToChronoMilliseconds(rpc)) {}

  absl::Status Publish(const std::string& key, const std::string& value) override {
    caf::scoped_actor self{sys_};
    absl::Status st = absl::UnavailableError("bootstrap: no reply from the coordinator");
    self->request(kv_, rpc_, put_atom::value, key, value)
        .receive([&](bool) { st = absl::OkStatus(); },
                 [&](caf::error& e) {
                   st = absl::UnavailableError(
                       absl::StrCat("bootstrap publish of ", key, ": ", sys_.render(e)));
                 });
    return st;
  }

  absl::StatusOr<std::string> Lookup(const std::string& key, absl::Time deadline) override {
    TROUPE_ASSIGN_OR_RETURN(std::vector<std::string> v, LookupAll({key}, deadline));
    return std::move(v[0]);
  }

  // Asks for every key still missing in one request until all are there: again after 2 ms,
  // doubling to 32 ms (at thousands of ranks a request is O(W) for the coordinator).
  absl::StatusOr<std::vector<std::string>> LookupAll(const std::vector<std::string>& keys,
                                                     absl::Time deadline) override {
    caf::scoped_actor self{sys_};
    std::vector<std::string> values(keys.size());
    std::vector<size_t> missing(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) missing[i] = i;
    absl::Duration wait = absl::Milliseconds(2);
    while (!missing.empty()) {
      if (aborted_below_->load() > gen_) {
        return absl::AbortedError(absl::StrCat("bootstrap of generation ", gen_, " aborted"));
      }
      KvKeys ask;
      for (size_t i : missing) ask.keys.push_back(keys[i]);
      absl::Status st;
      self->request(kv_, rpc_, get_atom::value, ask)
          .receive(
              [&](KvValues& got) {
                if (got.values.size() != missing.size()) {
                  st = absl::DataLossError(absl::StrCat("bootstrap lookup: ", got.values.size(),
                                                        " values for ", missing.size(), " keys"));
                  return;
                }
                std::vector<size_t> still;
                for (int32_t m : got.missing) {
                  if (m < 0 || static_cast<size_t>(m) >= missing.size()) {
                    st = absl::DataLossError(absl::StrCat("bootstrap lookup: missing index ", m,
                                                          " of ", missing.size(), " keys"));
                    return;
                  }
                  still.push_back(missing[m]);
                }
                for (size_t a = 0; a < missing.size(); ++a) {
                  values[missing[a]] = std::move(got.values[a]);
                }
                missing = std::move(still);
              },
              [&](caf::error& e) {
                st = absl::UnavailableError(absl::StrCat("bootstrap lookup of ", ask.keys[0],
                                                         " and ", ask.keys.size() - 1,
                                                         " more: ", sys_.render(e)));
              });
      if (!st.ok()) return st;
      if (missing.empty()) break;
      if (base::MonotonicNow() > deadline) return NeverPublished(keys[missing[0]]);
      absl::SleepFor(wait);
      wait = std::min(wait * 2, absl::Milliseconds(32));
    }
    return values;
  }

 private:
  // The rank whose key it is never got as far as publishing it: blame it.
  static absl::Status NeverPublished(const std::string& key) {
    int rank = -1;
    const size_t slash = key.rfind('/');
    absl::Status late =
        absl::DeadlineExceededError(absl::StrCat("bootstrap: ", key, " never published"));
    if (slash != std::string::npos && absl::SimpleAtoi(key.substr(slash + 1), &rank)) {
      late = collectives::BlamePeer(std::move(late), rank);
    }
    return late;
  }

  caf::actor_system& sys_;
  caf::actor kv_;
  uint64_t gen_;
  const std::atomic<uint64_t>* aborted_below_;
  std::chrono::milliseconds rpc_;
};

}  // namespace troupe::actors::internal

#endif  // TROUPE_ACTORS_COORDINATOR_BOOTSTRAP_H_
