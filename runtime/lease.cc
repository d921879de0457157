#include "internal/lease.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace troupe::runtime::internal {

absl::StatusOr<LeaseTable::Grant> LeaseTable::Acquire(const std::string& name,
                                                      const std::string& holder,
                                                      const std::string& worker,
                                                      Clock::time_point now, Clock::duration length,
                                                      uint64_t wall_us) {
  auto it = leases_.find(name);
  if (it != leases_.end() && it->second.holder != holder && now < it->second.grant.expiry) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(it->second.grant.expiry - now);
    return absl::UnavailableError(
        absl::StrCat("the lease on '", name, "' is held by ", it->second.holder, " (epoch ",
                     it->second.grant.epoch, ") for another ", left.count(), "ms"));
  }
  if (it == leases_.end() || it->second.holder != holder) {
    last_epoch_ = std::max(last_epoch_ + 1, wall_us);
    it = leases_.insert_or_assign(name, Lease{holder, worker, Grant{last_epoch_, now}}).first;
  }
  it->second.grant.expiry = now + length;
  return it->second.grant;
}

void LeaseTable::ReleaseWorker(const std::string& worker) {
  for (auto& [name, lease] : leases_) {
    if (lease.worker == worker) lease.grant.expiry = Clock::time_point::min();
  }
}

}  // namespace troupe::runtime::internal
