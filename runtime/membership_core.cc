#include "membership_core.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace troupe::runtime {
namespace {

using Actions = std::vector<MembershipAction>;

MembershipAction Make(MembershipAction::Kind kind, const std::string& member,
                      const std::string& node = "", const std::string& detail = "") {
  MembershipAction a;
  a.kind = kind;
  a.member = member;
  a.node = node;
  a.detail = detail;
  return a;
}

int64_t Millis(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace

std::string DebugString(const MembershipAction& a) {
  using K = MembershipAction::Kind;
  switch (a.kind) {
    case K::kPublish: {
      std::string s = absl::StrCat("publish(", a.bump ? "+" : "", "g", a.event.generation, ",",
                                   Name(a.event.kind), ",", a.event.subject);
      if (a.event.cause != base::ExitCause::kNone)
        absl::StrAppend(&s, ",", base::ExitCauseName(a.event.cause));
      return s + ")";
    }
    case K::kRefuse:
      return absl::StrCat("refuse(", absl::StatusCodeToString(a.status.code()), ")");
    case K::kPlaceJobs:
      return "place_jobs";
    case K::kAskRejoin:
      return absl::StrCat("ask_rejoin(", a.member, ")");
    case K::kFence:
      return absl::StrCat("fence(", a.node, ",", a.member, ")");
    case K::kReleaseNode:
      return absl::StrCat("release_node(", a.member, ")");
    case K::kReleaseLeases:
      return absl::StrCat("release_leases(", a.member, ")");
    case K::kReleaseActors:
      return absl::StrCat("release_actors(", a.member, ")");
    case K::kSchedulerDrain:
      return absl::StrCat("sched_drain(", a.node, ")");
    case K::kSchedulerRemove:
      return absl::StrCat("sched_remove(", a.node, ")");
    case K::kFailJobs:
      return absl::StrCat("fail_jobs(", a.node, ")");
    case K::kFlushAfter:
      return absl::StrCat("flush_after(", Millis(a.delay), "ms,", a.member, ")");
    case K::kSyncHeartbeats:
      return absl::StrCat("sync_heartbeats(", a.member, ")");
  }
  return "?";
}

std::string DebugString(const std::vector<MembershipAction>& actions) {
  return absl::StrJoin(actions, " ", [](std::string* out, const MembershipAction& a) {
    out->append(DebugString(a));
  });
}

const char* Name(MemberPhase p) {
  switch (p) {
    case MemberPhase::kAbsent:
      return "absent";
    case MemberPhase::kAlive:
      return "alive";
    case MemberPhase::kDraining:
      return "draining";
    case MemberPhase::kDownPending:
      return "down_pending";
    case MemberPhase::kDead:
      return "dead";
    case MemberPhase::kDeadExited:
      return "dead_exited";
    case MemberPhase::kDeadRejoining:
      return "dead_rejoining";
  }
  return "?";
}

MembershipCore::MembershipCore(Options options) : options_(std::move(options)) {}

void MembershipCore::Restore(uint64_t generation, std::vector<MemberInfo> members) {
  generation_ = generation;
  restored_ = std::move(members);
  expecting_restored_ = true;
}

void MembershipCore::Publish(Actions* out, MembershipKind kind, const std::string& subject,
                             const std::string& node, int64_t pid, const std::string& detail,
                             const std::string& tail, bool bump, base::ExitCause cause,
                             int exit_code, int signal) {
  if (bump) ++generation_;
  MembershipAction a = Make(MembershipAction::Kind::kPublish, subject, node);
  a.event = MembershipEvent{generation_, kind, subject, node,      pid,
                            detail,      tail, cause,   exit_code, signal};
  a.bump = bump;
  if (auto m = members_.find(subject); bump && m != members_.end()) a.record = m->second.info;
  out->push_back(std::move(a));
}

Actions MembershipCore::OnHello(uint32_t version, const std::string& build_id,
                                const std::string& kind, const std::string& name) {
  std::string why;
  if (version != options_.protocol_version) {
    why = absl::StrCat(kind, " '", name, "' refused: it speaks cluster protocol version ", version,
                       ", this head speaks version ", options_.protocol_version,
                       "; run the same troupe release everywhere");
  } else if (build_id != options_.build_id) {
    why = absl::StrCat(kind, " '", name, "' refused: its build id ", build_id,
                       " differs from the head's ", options_.build_id,
                       "; run the same binary everywhere");
  } else {
    return {};
  }
  // The kind is text in this frozen message; a node is its own node in the event.
  auto member = ParseMemberKind(kind);
  const bool node = member.ok() && *member == MemberKind::kNode;
  Actions out;
  Publish(&out, MembershipKind::kRefused, name, node ? name : "", 0, why, "", /*bump=*/false);
  MembershipAction refuse = Make(MembershipAction::Kind::kRefuse, name);
  refuse.status = absl::FailedPreconditionError(why);
  out.push_back(std::move(refuse));
  return out;
}

absl::Status MembershipCore::CheckNodeJoin(const std::string& name) const {
  auto it = members_.find(name);
  if (it != members_.end() && it->second.info.state != MemberState::kDead) {
    return absl::AlreadyExistsError(absl::StrCat("node '", name, "' is already a member"));
  }
  return absl::OkStatus();
}

Actions MembershipCore::OnNodeJoined(const MemberInfo& node, TimePoint now) {
  Member m;
  m.info =
      MemberInfo{node.id,     MemberKind::kNode, node.id,  MemberState::kAlive, 0, node.resources,
                 node.labels, node.address,      node.host};
  m.last_seen = now;
  last_heard_ = now;
  members_[node.id] = std::move(m);
  Actions out;
  Publish(&out, MembershipKind::kNodeAlive, node.id, node.id, 0,
          absl::StrCat("resources ", node.resources, " labels ", node.labels, " address ",
                       node.address, " host ", node.host));
  out.push_back(Make(MembershipAction::Kind::kPlaceJobs, node.id, node.id));
  return out;
}

Actions MembershipCore::OnRegisterWorker(const MemberInfo& worker, TimePoint now) {
  const std::string& id = worker.id;
  // A worker once declared dead (here, or by the head before this one) stays dead: its node
  // joins again with new workers instead (fencing). A worker of a node declared dead would get
  // nothing placed on it (the scheduler dropped its node).
  bool dead = false;
  if (auto old = members_.find(id); old != members_.end()) {
    dead = old->second.info.state == MemberState::kDead;
  }
  for (const MemberInfo& r : restored_) dead |= r.id == id && r.state == MemberState::kDead;
  absl::Status refusal;
  auto n = members_.find(worker.node);
  if (dead) {
    refusal = absl::FailedPreconditionError(
        absl::StrCat("worker '", id, "' refused: it was declared dead"));
  } else if (n == members_.end() || n->second.info.state != MemberState::kAlive) {
    refusal = absl::FailedPreconditionError(
        absl::StrCat("worker '", id, "' refused: its node '", worker.node, "' is ",
                     n == members_.end() ? "unknown" : Name(n->second.info.state)));
  }
  if (!refusal.ok()) {
    MembershipAction refuse = Make(MembershipAction::Kind::kRefuse, id, worker.node);
    refuse.status = std::move(refusal);
    return {std::move(refuse)};
  }
  Member m;
  m.info.id = id;
  m.info.kind = MemberKind::kWorker;
  m.info.node = worker.node;
  m.info.state = MemberState::kAlive;
  m.info.pid = worker.pid;
  m.info.address = n->second.info.address;
  m.info.host = n->second.info.host;
  m.info.port = worker.port;
  m.info.direct_port = worker.direct_port;
  m.last_seen = now;
  last_heard_ = now;
  members_[id] = std::move(m);
  Actions out;
  Publish(&out, MembershipKind::kWorkerAlive, id, worker.node, worker.pid, "");
  return out;
}

Actions MembershipCore::OnHeartbeat(const std::string& id, const Heartbeat& beat, TimePoint now) {
  auto it = members_.find(id);
  if (it == members_.end()) return {};
  Member& m = it->second;
  Actions out;
  if (m.info.state == MemberState::kDead) {
    // A node declared dead (cut off) is heard from again: it joins again as a new member, its
    // workers (fenced, their state stale) replaced by new ones.
    if (m.info.kind == MemberKind::kNode && !m.rejoin_asked) {
      m.rejoin_asked = true;
      out.push_back(Make(MembershipAction::Kind::kAskRejoin, id, id));
    }
    return out;
  }
  // The first heartbeat after the head heard nobody: nobody's silence counts for that time.
  if (const Duration deaf = Deafness(now); deaf > Duration::zero()) {
    const Duration credit = deaf - options_.heartbeat_interval;
    for (auto& [other, o] : members_) o.last_seen += credit;
  }
  last_heard_ = now;
  m.last_seen = now;
  if (beat.base == 0) {
    m.busy.clear();
    m.beats_synced = true;
    m.sync_asked.reset();
  } else if (!m.beats_synced || beat.base != m.beat_version) {
    if (!m.sync_asked || now - *m.sync_asked >= options_.heartbeat_timeout) {
      m.sync_asked = now;
      out.push_back(Make(MembershipAction::Kind::kSyncHeartbeats, id, m.info.node));
    }
    return out;
  }
  m.beat_version = beat.version;
  for (const ActorBusy& a : beat.changes) {
    const auto key = std::make_pair(a.name, a.generation);
    if (a.busy_ms == 0) {
      m.busy.erase(key);
    } else {
      m.busy[key] = Member::Busy{now - std::chrono::milliseconds(a.busy_ms), a.progress};
    }
  }
  for (auto& [key, b] : m.busy) {
    const std::string& name = key.first;
    const auto busy_ms = Millis(now - b.since);
    if (b.published || busy_ms < Millis(options_.hung_timeout)) continue;
    b.published = true;
    Publish(&out, MembershipKind::kActorHung, name, m.info.node, m.info.pid,
            absl::StrCat("handler running for ", busy_ms, "ms on worker ", id, " (progress ",
                         b.progress, ")"),
            "", /*bump=*/false);
  }
  return out;
}

// Usually the exit status marks the worker dead; when the head already had (a lost connection
// whose report waited out the flush delay, or a fence for missed heartbeats), the real status
// follows as worker_exit, so no death goes unexplained.
Actions MembershipCore::OnWorkerExit(const std::string& id, const std::string& tail,
                                     int32_t wait_status, bool fenced) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.exit_known) return {};
  Actions out;
  // The process is gone: nothing of it can act under a lease.
  out.push_back(Make(MembershipAction::Kind::kReleaseLeases, id, it->second.info.node));
  Member& m = it->second;
  base::SupervisionEvent e = base::ProcessExitEvent("", id, m.info.pid, wait_status, fenced);
  m.exit_known = true;
  m.stderr_tail = tail;
  if (m.down_reported) {
    Publish(&out, MembershipKind::kWorkerExit, id, m.info.node, m.info.pid, "process " + e.reason,
            tail, /*bump=*/false, e.cause, e.exit_code, e.signal);
    return out;
  }
  m.exit_detail = "process " + e.reason;
  m.cause = e.cause;
  m.exit_code = e.exit_code;
  m.signal = e.signal;
  MarkWorkerDead(&out, id, m.exit_detail, e.cause);
  ReportWorkerDown(&out, id);
  return out;
}

Actions MembershipCore::OnFlush(const std::string& id) {
  Actions out;
  ReportWorkerDown(&out, id);
  return out;
}

Actions MembershipCore::OnConnectionLost(const std::string& id, const std::string& reason) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.info.state == MemberState::kDead) return {};
  Actions out;
  const std::string why = "connection lost (" + reason + ")";
  if (it->second.info.kind == MemberKind::kWorker) {
    MarkWorkerDead(&out, id, why, base::ExitCause::kLost);
  } else {
    MarkNodeDead(&out, id, why);
  }
  return out;
}

Actions MembershipCore::OnDrain(const std::string& node, int64_t grace_ms,
                                const std::string& notice) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.info.state != MemberState::kAlive) return {};
  it->second.info.state = MemberState::kDraining;
  Actions out{Make(MembershipAction::Kind::kSchedulerDrain, node, node)};
  Publish(&out, MembershipKind::kNodeDraining, node, node, 0,
          absl::StrCat("preemption notice (", notice, "); leaves within ", grace_ms, "ms"));
  return out;
}

Actions MembershipCore::OnRelease(const std::string& node) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.info.kind != MemberKind::kNode ||
      it->second.info.state != MemberState::kDraining) {
    return {};
  }
  return {Make(MembershipAction::Kind::kReleaseNode, node, node)};
}

Actions MembershipCore::OnLeave(const std::string& node) {
  Actions out;
  MarkNodeDead(&out, node, "left");
  return out;
}

Actions MembershipCore::OnTick(TimePoint now) {
  // Silence that overlaps the head's own stall is not the members': on an oversubscribed host
  // the head process can go unscheduled for over a heartbeat_timeout, and on waking it would
  // find every member silent at once (seen: all four nodes of a job declared dead together,
  // 1.07-1.18 s against a 1 s timeout, and the job lost). A tick later than two heartbeat
  // intervals shifts every member's last heartbeat by the stall instead; the heartbeats that
  // queued up meanwhile arrive within the next ticks.
  const Duration tick = options_.heartbeat_interval / 4;
  if (last_tick_ && now - *last_tick_ > 2 * options_.heartbeat_interval) {
    const Duration stall = now - *last_tick_ - tick;
    for (auto& [id, m] : members_) m.last_seen += stall;
    if (restored_since_) *restored_since_ += stall;  // nor is the wait for the restored
    if (last_heard_) *last_heard_ += stall;
  }
  last_tick_ = now;
  ExpectRestored(now);
  // Hearing no member at all (see the header): no verdict until 2 × heartbeat_timeout.
  const Duration deaf = Deafness(now);
  if (deaf > Duration::zero() && deaf <= 2 * options_.heartbeat_timeout) return {};
  std::vector<std::string> silent;
  for (auto& [id, m] : members_) {
    if (m.info.state == MemberState::kDead) continue;
    if (now - m.last_seen > options_.heartbeat_timeout) silent.push_back(id);
  }
  Actions out;
  for (const auto& id : silent) DeclareSilent(&out, id, now);
  return out;
}

Duration MembershipCore::Deafness(TimePoint now) const {
  // Checked first: this runs at every heartbeat, and counting the nodes is a pass over all.
  if (!last_heard_ || now - *last_heard_ <= 2 * options_.heartbeat_interval) {
    return Duration::zero();
  }
  int nodes = 0;
  for (const auto& [id, m] : members_) {
    nodes += m.info.kind == MemberKind::kNode && m.info.state != MemberState::kDead;
  }
  return nodes >= 2 ? now - *last_heard_ : Duration::zero();
}

void MembershipCore::ExpectRestored(TimePoint now) {
  if (!expecting_restored_) return;
  if (!restored_since_) restored_since_ = now;
  if (now - *restored_since_ <= 2 * options_.heartbeat_timeout) return;
  // The previous head's alive members that have not come back (they retry every few hundred ms)
  // become members last heard from at this head's start: silent past heartbeat_timeout, they are
  // declared dead below like any other, and fenced (found by `troupe chaos`: a worker stopped
  // while the head restarted was never declared dead, and every generation that counted on it
  // waited out its bootstrap timeout until the job's watchdog failed it).
  std::vector<MemberInfo> dead;
  for (MemberInfo& r : restored_) {
    if (r.state == MemberState::kDead) {
      dead.push_back(std::move(r));
    } else if (!members_.count(r.id)) {
      Member m;
      m.info = std::move(r);
      m.last_seen = *restored_since_;
      members_[m.info.id] = std::move(m);
    }
  }
  restored_ = std::move(dead);
  expecting_restored_ = false;
}

void MembershipCore::DeclareSilent(Actions* out, const std::string& id, TimePoint now) {
  Member& m = members_[id];
  const std::string why = absl::StrCat("no heartbeat for ", Millis(now - m.last_seen),
                                       "ms (timeout ", Millis(options_.heartbeat_timeout), "ms)");
  if (m.info.kind == MemberKind::kWorker) {
    MarkWorkerDead(out, id, absl::StrCat("fenced: ", why), base::ExitCause::kFenced);
    ReportWorkerDown(out, id);
    // Fence it: a stopped process must not come back and act on stale state.
    auto node = members_.find(m.info.node);
    if (node != members_.end() && node->second.info.state != MemberState::kDead) {
      out->push_back(Make(MembershipAction::Kind::kFence, id, m.info.node));
    }
    return;
  }
  // A silent node may still hear us (a one-way partition): its agent kills the workers, which
  // must not act on stale state either; when it is heard from again it rejoins.
  for (const auto& [wid, w] : members_) {
    if (w.info.kind == MemberKind::kWorker && w.info.node == id &&
        w.info.state != MemberState::kDead) {
      out->push_back(Make(MembershipAction::Kind::kFence, wid, id));
    }
  }
  MarkNodeDead(out, id, why);
}

bool MembershipCore::HasAliveWorker(const std::string& node) const {
  for (const auto& [wid, w] : members_) {
    if (w.info.kind == MemberKind::kWorker && w.info.state == MemberState::kAlive &&
        w.info.node == node) {
      return true;
    }
  }
  return false;
}

void MembershipCore::MarkWorkerDead(Actions* out, const std::string& id, const std::string& why,
                                    base::ExitCause cause) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.info.state == MemberState::kDead) return;
  Member& m = it->second;
  m.info.state = MemberState::kDead;
  if (m.exit_detail.empty()) m.exit_detail = why;
  if (m.cause == base::ExitCause::kNone) m.cause = cause;
  out->push_back(Make(MembershipAction::Kind::kReleaseActors, id, m.info.node,
                      "worker " + id + " died: " + why));
  // A node whose last worker died can host nothing more: no new placements there (the
  // scheduler would otherwise keep choosing it and every spawn would fail).
  if (auto node = members_.find(m.info.node); !HasAliveWorker(m.info.node) &&
                                              node != members_.end() &&
                                              node->second.info.state == MemberState::kAlive) {
    out->push_back(Make(MembershipAction::Kind::kSchedulerDrain, id, m.info.node));
  }
  // The exit report from the node agent normally follows within milliseconds; wait for it
  // briefly so the down event can carry the exit status and the stderr tail.
  MembershipAction flush = Make(MembershipAction::Kind::kFlushAfter, id, m.info.node);
  flush.delay = options_.exit_report_wait;
  out->push_back(std::move(flush));
}

void MembershipCore::ReportWorkerDown(Actions* out, const std::string& id) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.down_reported ||
      it->second.info.state != MemberState::kDead) {
    return;
  }
  Member& m = it->second;
  m.down_reported = true;
  Publish(out, MembershipKind::kWorkerDown, id, m.info.node, m.info.pid, m.exit_detail,
          m.stderr_tail, /*bump=*/true, m.cause, m.exit_code, m.signal);
}

void MembershipCore::MarkNodeDead(Actions* out, const std::string& node, const std::string& why) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.info.state == MemberState::kDead) return;
  for (auto& [id, m] : members_) {
    if (m.info.kind == MemberKind::kWorker && m.info.node == node &&
        m.info.state != MemberState::kDead) {
      MarkWorkerDead(out, id, "its node " + why, base::ExitCause::kLost);
      ReportWorkerDown(out, id);
    }
  }
  it->second.info.state = MemberState::kDead;
  out->push_back(Make(MembershipAction::Kind::kFailJobs, node, node,
                      absl::StrCat("its driver's node ", node, " ", why)));
  // Its actors were released above (their workers died with it); nothing is left to move.
  out->push_back(Make(MembershipAction::Kind::kSchedulerRemove, node, node));
  // A node that left exits 0 right after; otherwise nobody here can see how it ended.
  const bool left = why == "left";
  Publish(out, MembershipKind::kNodeDead, node, node, it->second.info.pid, why, "", /*bump=*/true,
          left ? base::ExitCause::kExited : base::ExitCause::kLost, left ? 0 : -1);
}

const MemberInfo* MembershipCore::Find(const std::string& id) const {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second.info;
}

MemberPhase MembershipCore::Phase(const std::string& id) const {
  auto it = members_.find(id);
  if (it == members_.end()) return MemberPhase::kAbsent;
  const Member& m = it->second;
  switch (m.info.state) {
    case MemberState::kJoining:  // never in the table
    case MemberState::kAlive:
      return MemberPhase::kAlive;
    case MemberState::kDraining:
      return MemberPhase::kDraining;
    case MemberState::kDead:
      break;
  }
  if (m.info.kind == MemberKind::kNode) {
    return m.rejoin_asked ? MemberPhase::kDeadRejoining : MemberPhase::kDead;
  }
  if (!m.down_reported) return MemberPhase::kDownPending;
  return m.exit_known ? MemberPhase::kDeadExited : MemberPhase::kDead;
}

std::vector<MemberInfo> MembershipCore::Members() const {
  std::vector<MemberInfo> out;
  out.reserve(members_.size());
  for (const auto& [id, m] : members_) out.push_back(m.info);
  return out;
}

std::string MembershipCore::DebugString() const {
  std::string s = absl::StrCat("generation ", generation_);
  for (const auto& [id, m] : members_) {
    absl::StrAppend(&s, "; ", id, " ", Name(m.info.kind), " ", Name(Phase(id)));
  }
  return s;
}

}  // namespace troupe::runtime
