// The head's jobs (internal/jobs.h keeps the table): submitted jobs' drivers placed on nodes,
// drivers registering and reporting, jobs ended by their driver, by `troupe job stop`, or by the
// loss of their driver or its node.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "head_actor.h"
#include "internal/resources.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime::internal {

caf::message_handler HeadActor::JobHandlers() {
  return {
      [this](job_submit_atom, const std::string& name, const std::string& spec,
             int64_t steps) -> std::string {
        const std::string id = jobs_.Submit(name, spec, steps, Now());
        aout(this) << "troupe-head: job " << id << " submitted (" << name << ", " << steps
                   << " steps)" << std::endl;
        PutJob(id);
        PlaceJobs();
        return id;
      },
      [this](job_register_atom, const std::string& id, const std::string& name,
             const std::string& spec, int64_t steps, int64_t pid, const std::string& node,
             const caf::actor& driver) -> caf::result<std::string> {
        return HandleJobRegister(id, name, spec, steps, pid, node, driver);
      },
      [this](job_events_atom, const std::string& id, const std::vector<std::string>& lines) {
        jobs_.Ingest(id, lines);
      },
      [this](job_log_atom, const std::string& id, const std::vector<std::string>& lines) {
        jobs_.Log(id, lines);
      },
      [this](job_end_atom, const std::string& id, const std::string& state,
             const std::string& error, const std::string& report) -> bool {
        EndJob(id, ParseJobState(state).value_or(JobState::kFailed), error, report);
        return true;
      },
      [this](job_exit_atom, const std::string& id, int64_t pid, int32_t wait_status,
             const std::string& tail) {
        base::SupervisionEvent e = base::ProcessExitEvent("head", id, pid, wait_status, false);
        std::string why =
            absl::StrCat("its driver (pid ", pid, ") ", e.reason, " before the job ended");
        if (!tail.empty()) absl::StrAppend(&why, "; its last lines:\n", tail);
        EndJob(id, JobState::kFailed, why, "");
      },
      [this](job_stop_atom, const std::string& id) -> caf::result<bool> {
        return HandleJobStop(id);
      },
  };
}

caf::result<std::string> HeadActor::HandleJobRegister(const std::string& id,
                                                      const std::string& name,
                                                      const std::string& spec, int64_t steps,
                                                      int64_t pid, const std::string& node,
                                                      const caf::actor& driver) {
  absl::StatusOr<std::string> r = jobs_.Register(id, name, spec, steps, pid, node, Now());
  if (!r.ok()) return StatusToError(r.status());
  drivers_[*r] = driver;
  monitor(driver);
  aout(this) << "troupe-head: job " << *r << " running, its driver pid " << pid
             << (node.empty() ? "" : " on ") << node << std::endl;
  PutJob(*r);
  return *r;
}

caf::result<bool> HeadActor::HandleJobStop(const std::string& id) {
  Job* j = jobs_.Find(id);
  if (j == nullptr) {
    return StatusToError(absl::NotFoundError(absl::StrCat("no job '", id, "'")));
  }
  if (JobEnded(j->state)) return false;
  auto d = drivers_.find(id);
  if (j->state == JobState::kPending || d == drivers_.end()) {
    EndJob(id, JobState::kStopped, "stopped by `troupe job stop` before it ran", "");
  } else {
    send(d->second, job_stop_atom::value, id);
  }
  return true;
}

double HeadActor::Now() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

void HeadActor::PutJob(const std::string& id) {
  if (const Job* j = jobs_.Find(id); store_ && j != nullptr) {
    StoreFailed(store_->PutJob(id, JobTable::Record(*j)));
  }
}

void HeadActor::EndJob(const std::string& id, JobState state, const std::string& error,
                       const std::string& report) {
  Job* j = jobs_.Find(id);
  if (j == nullptr || JobEnded(j->state)) return;
  jobs_.End(id, state, error, report, Now());
  drivers_.erase(id);
  EndGang(id);
  if (!j->node.empty()) ReleaseIfIdle(j->node);
  aout(this) << "troupe-head: job " << id << " " << Name(state) << (error.empty() ? "" : ": ")
             << error << std::endl;
  PutJob(id);
}

void HeadActor::FailJobsOn(const std::string& node, const std::string& why) {
  for (const auto& [id, j] : jobs_.jobs()) {
    if (j.submitted && j.node == node && !JobEnded(j.state)) {
      EndJob(id, JobState::kFailed, why, "");
    }
  }
}

// A job whose driver is gone before it said how the job ended (`troupe train` killed; a
// submitted job's driver is reported by its node agent, with its exit status).
void HeadActor::DriverDown(const caf::down_msg& dm) {
  for (const auto& [jid, driver] : drivers_) {
    const Job* j = jobs_.Find(jid);
    if (driver.address() != dm.source || j == nullptr || j->submitted) continue;
    const std::string id = jid;  // EndJob erases the entry
    EndJob(
        id, JobState::kFailed,
        absl::StrCat("its driver is gone (", caf::to_string(dm.reason), ") before the job ended"),
        "");
    break;
  }
}

// Submitted jobs whose driver has no node yet: each to the alive node running the fewest
// drivers, on-demand nodes first (a spot node's preemption would take the driver with it).
void HeadActor::PlaceJobs() {
  for (const std::string& id : jobs_.Unplaced()) {
    auto drivers_on = [this](const std::string& node) {
      size_t n = 0;
      for (const auto& [jid, j] : jobs_.jobs()) n += j.node == node && !JobEnded(j.state);
      return n;
    };
    auto rank = [&](const MemberInfo& m) { return std::make_pair(IsSpot(m), drivers_on(m.id)); };
    const MemberInfo* best = nullptr;
    core_.ForEachMember([&](const MemberInfo& m) {
      if (m.kind != MemberKind::kNode || m.state != MemberState::kAlive) return;
      if (best == nullptr || rank(m) < rank(*best)) best = &m;
    });
    if (best == nullptr) return;  // placed when a node joins
    jobs_.Placed(id, best->id);
    PutJob(id);
    aout(this) << "troupe-head: job " << id << ": its driver starts on node " << best->id
               << std::endl;
    send(Handle(best->id), job_run_atom::value, id, jobs_.Find(id)->spec_toml);
  }
}

bool HeadActor::IsSpot(const MemberInfo& node) {
  absl::StatusOr<std::map<std::string, std::string>> labels = ParseLabels(node.labels, "labels");
  if (!labels.ok()) return false;
  auto spot = labels->find(scheduler::kSpotLabel);
  return spot != labels->end() && spot->second == "true";
}

}  // namespace troupe::runtime::internal
