// lease_gate.h — when the coordinator may carry out its actions: the lease gate, as a pure state
// machine.
//
// What outlives a coordinator incarnation (its record, a rank's configure and commit, a checkpoint
// named in LATEST, the step log, the report: NeedsLease below) is done only under the head's lease
// on the coordinator's name (lease_atom in troupe/runtime/cluster.h), so that two incarnations
// never both act (no split brain). LeaseGate holds the core's actions (CoordinatorCore) in order
// and lets them out only while the lease is held; it decides when to ask the head for the lease,
// when a new epoch must claim the checkpoint store, when to wait for a head that took over, and
// when this incarnation gives up. No actors, no I/O, no clock: the coordinator actor
// (coordinator.cc) feeds it events with the current time and carries out the actions it returns,
// in order; a test does the same by hand.
//
// The lease ("held": granted, and now + margin < until, where until is the granting request's
// send time + the granted length; the margin is a quarter lease when a batch starts):
//
//                (1)               (3)
//   unleased ──────────▶ held ────────────▶ expired
//   (epoch 0)            ▲  │                  │
//                        └──┘ (2)              │ (2)
//                        ▲                     │
//                        └─────────────────────┘
//   any ──(4) OnHeadLost──▶ head lost ──OnHeadTick(found)──▶ the state it was in
//   any ──(5)──▶ lost (terminal)
//
//   (1) OnGranted(e) → claim(e); OnClaimed(ok) → run_queue: epoch e from now on.
//   (2) OnGranted(e) → run_queue (renewed). A head that took over grants e' ≠ e: claim(e'), then
//       OnClaimed(ok) → announce_epoch(e') run_queue.
//   (3) time passes: now ≥ until. Each OnTick asks again.
//   (4) head_lost, check_head: no asks, and the wait of (5) is not counted; OnHeadTick finding
//       no new head → check_head after head_poll; finding one → head_back, follow_head,
//       ask_lease.
//   (5) lose_lease, and nothing runs again: OnTick with the lease needed (actions wait for a
//       first grant, or it expired) and the head silent for lease_wait since the first ask;
//       OnRefused(FailedPrecondition): replaced; OnClaimed(error): a later epoch claimed the
//       store.
//
// The queue (Enqueue; carried out by pulling Next until it returns nothing: run_queue):
//
//   running ── the front needs the lease, its batch not yet let through, not held ──▶ waiting
//      ▲          (ask_lease, unless asked already or no head to ask)                  │
//      └──────────────── OnGranted / OnClaimed(ok): run_queue ─────────────────────────┘
//
// A batch (the actions of one core call) is all or nothing under the lease: a step's record save,
// its commits and its line in the step log must not be split by a lease lost in between (the
// record would count a step the log never names). So the lease is checked once per batch, at its
// first action that needs it, with a quarter lease to spare. A batch enqueued from inside an
// action (a checkpoint's outcome) goes ahead of what followed that action.
//
// Stop (the job ended, or the coordinator moves): nothing more runs or is asked.
//
// Not thread-safe: owned by one actor.
#ifndef TROUPE_ACTORS_LEASE_GATE_H_
#define TROUPE_ACTORS_LEASE_GATE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "troupe/train/coordinator_core.h"

namespace troupe::actors {

// Actions whose effects outlive this incarnation: carried out only under the lease.
bool NeedsLease(train::CoordinatorAction::Kind kind);

struct LeaseAction {
  enum class Kind {
    kRun,            // carry out `action` (the core's) now
    kRunQueue,       // pull Next() until it returns nothing, carrying out each action it returns
    kAskLease,       // ask the head for the lease; its answer: OnGranted or OnRefused
    kClaim,          // claim the checkpoint store under `epoch`; its outcome: OnClaimed
    kAnnounceEpoch,  // tell every rank the new `epoch` (their checkpoint writes come after it)
    kLoseLease,      // log lease_lost (`epoch`, `held` actions never carried out, `reason`); quit
                     // with an error, so that a supervisor that still sees this incarnation
                     // starts another
    kTick,           // call OnTick after `delay`
    kHeadLost,       // log head_lost (`reason`)
    kCheckHead,      // after `delay`, look for the head that took over and call OnHeadTick
    kHeadBack,       // log head_back: the head was missing for `delay`
    kFollowHead,     // monitor the head just named or found, and subscribe to its membership
  };
  explicit LeaseAction(Kind k) : kind(k) {}
  Kind kind;
  std::optional<train::CoordinatorAction> action;  // kRun
  uint64_t epoch = 0;                              // kClaim, kAnnounceEpoch, kLoseLease
  int64_t held = 0;                                // kLoseLease
  train::CoreDuration delay{0};                    // kTick, kCheckHead, kHeadBack
  std::string reason;                              // kLoseLease, kHeadLost
};

// The short form tests compare: "run(save)", "ask_lease", "claim(e2)", "tick(250ms)", ...
std::string DebugString(const LeaseAction& a);

class LeaseGate {
 public:
  struct Options {
    // The lease needed and the head silent this long since the first ask: this incarnation
    // gives up (whoever can still reach the head takes over).
    train::CoreDuration lease_wait = std::chrono::seconds(3);
    // Ticks come a quarter lease apart (at least min_tick), so that actions rarely wait for it;
    // every first_tick before the first grant.
    std::chrono::milliseconds min_tick{20};
    std::chrono::milliseconds first_tick{50};
    // How often a coordinator without a head looks for the one that took over.
    train::CoreDuration head_poll = std::chrono::milliseconds(20);
  };

  LeaseGate() : LeaseGate(Options{}) {}
  explicit LeaseGate(Options options) : options_(options) {}

  // The core's actions of one call, in order: behind the queue, or ahead of it when enqueued
  // from inside an action (`from_action`: its consequences come before what followed it).
  std::vector<LeaseAction> Enqueue(std::vector<train::CoordinatorAction> batch, bool from_action);
  // The next action to carry out (kRun), or the lease to ask for (kAskLease), or nothing: the
  // queue is empty, or waits for the lease.
  std::optional<LeaseAction> Next(train::CoreTime now);

  // The driver named the head (KnownRanks).
  std::vector<LeaseAction> OnHeadNamed();
  // The head granted the lease (epoch, length) to the request sent at `sent`.
  std::vector<LeaseAction> OnGranted(uint64_t epoch, std::chrono::milliseconds length,
                                     train::CoreTime sent);
  // The store claim asked by kClaim came out `status`.
  std::vector<LeaseAction> OnClaimed(const absl::Status& status);
  // The head refused the request or did not answer: Unavailable while another incarnation's lease
  // runs, or no answer (the tick asks again); FailedPrecondition: this incarnation was replaced.
  std::vector<LeaseAction> OnRefused(const absl::Status& status);
  // The periodic tick (kTick): renews the lease, and gives up on it (see Options::lease_wait).
  // The wait counts from the first ask after the need arose, not from when the lease ran out: a
  // process stalled meanwhile (a handler blocked in a slow fsync on shared storage) asks once it
  // runs again, and goes on if the head renews it (no other incarnation was granted it between).
  std::vector<LeaseAction> OnTick(train::CoreTime now);
  // The head's connection was lost (`why`): actions under the lease wait, the ranks finish their
  // step and wait for its commit, until this process has rejoined the head that takes over.
  std::vector<LeaseAction> OnHeadLost(const std::string& why, train::CoreTime now);
  // A look for the head that took over (kCheckHead): `found` when this process has rejoined one.
  std::vector<LeaseAction> OnHeadTick(bool found, train::CoreTime now);
  // The job ended, or this incarnation moves off its node: nothing more runs or is asked.
  void Stop();

  bool stopped() const { return stopped_; }
  uint64_t epoch() const { return epoch_; }  // 0 until the first grant
  // Held, now and for `margin` more.
  bool Held(train::CoreTime now, train::CoreDuration margin = train::CoreDuration::zero()) const {
    return epoch_ != 0 && now + margin < lease_until_;
  }
  size_t queued() const { return queue_.size(); }
  std::string DebugString() const;

 private:
  using Actions = std::vector<LeaseAction>;

  // kAskLease into `out`, unless asked already, stopped, or no head to ask.
  void Ask(Actions* out);
  void Lose(Actions* out, const std::string& why);

  Options options_;
  // The core's actions not yet carried out, in order, each with the batch it came from.
  std::deque<std::pair<uint64_t, train::CoordinatorAction>> queue_;
  uint64_t next_batch_ = 1;
  uint64_t leased_batch_ = 0;  // the batch let through under the lease
  bool stopped_ = false;
  bool has_head_ = false;
  uint64_t epoch_ = 0;
  train::CoreTime lease_until_{};
  std::chrono::milliseconds lease_length_{0};
  bool asked_ = false;
  struct Grant {
    uint64_t epoch;
    std::chrono::milliseconds length;
    train::CoreTime sent;
  };
  // Held from now on: the lease runs until `sent` + `length`.
  void Renewed(const Grant& g);

  // A grant of a new epoch, until its claim comes out (OnClaimed).
  std::optional<Grant> claiming_;
  std::optional<train::CoreTime>
      waiting_since_;  // the queue's front has waited for the lease since
  std::optional<train::CoreTime>
      asking_since_;  // the lease is needed and asked for, unanswered, since
  std::optional<train::CoreTime>
      head_lost_;  // the head's connection was lost at, until one is back
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_LEASE_GATE_H_
