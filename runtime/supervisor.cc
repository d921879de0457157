#include "troupe/runtime/supervisor.h"

#include <deque>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/context.h"
#include "internal/spawn.h"
#include "supervisor_core.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {
namespace {

using restart_atom = caf::atom_constant<caf::atom("tr_restrt")>;
using stop_timeout_atom = caf::atom_constant<caf::atom("tr_stopto")>;

ExitKind Classify(const caf::error& reason) {
  if (!reason) return ExitKind::kNormal;
  if (reason.category() == caf::atom("exit")) {
    switch (static_cast<caf::exit_reason>(reason.code())) {
      case caf::exit_reason::normal:
        return ExitKind::kNormal;
      case caf::exit_reason::kill:
        return ExitKind::kKilled;
      case caf::exit_reason::user_shutdown:
        return ExitKind::kShutdown;
      default:
        break;
    }
  }
  return ExitKind::kError;
}

std::vector<CoreChild> CoreChildren(const SupervisorSpec& spec) {
  std::vector<CoreChild> out;
  for (const auto& c : spec.children) out.push_back(CoreChild{c.name, c.restart, c.backoff});
  return out;
}

// The CAF side of a supervisor: carries out SupervisorCore's actions, one at a time; a stop
// holds the queue until the child is down (or killed after its shutdown timeout).
class SupervisorActor final : public Actor {
 public:
  SupervisorActor(caf::actor_config& cfg, std::string name, uint64_t generation,
                  std::shared_ptr<internal::Context> ctx,
                  std::shared_ptr<const SupervisorSpec> spec)
      : Actor(cfg, std::move(name), generation, std::move(ctx)),
        spec_(std::move(spec)),
        core_(spec_->name, spec_->strategy, spec_->intensity, CoreChildren(*spec_), spec_->seed),
        handles_(spec_->children.size()),
        generations_(spec_->children.size(), 0) {}

  caf::behavior make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) { HandleDown(dm); });
    set_exit_handler([this](caf::exit_msg& em) { HandleExit(em); });
    Enqueue(core_.Start(clock().now()));
    return {
        [this](internal::rdown_atom, const std::string& name, uint64_t gen,
               const caf::error& reason,
               const std::string& detail) { HandleRemoteDown(name, gen, reason, detail); },
        [this](restart_atom, uint64_t timer) { Enqueue(core_.OnTimer(timer, clock().now())); },
        [this](stop_timeout_atom, uint64_t child, uint64_t gen) {
          if (stopping_ && stopping_->child == child && stopping_->generation == gen) {
            Emit(child, generations_[child], "stop", "shutdown timeout; killing", "");
            caf::anon_send_exit(handles_[child], caf::exit_reason::kill);
          }
        },
        [this](which_atom, const std::string& child) -> caf::result<caf::actor, uint64_t> {
          size_t i = core_.Find(child);
          if (i == core_.size() || !core_.running(i)) {
            return StatusToError(
                absl::NotFoundError(absl::StrCat("no running child named '", child, "'")));
          }
          return {handles_[i], generations_[i]};
        },
    };
  }

  void on_exit() override {
    // However the supervisor ends (even killed), its children do not outlive it.
    for (auto& h : handles_)
      if (h) caf::anon_send_exit(h, caf::exit_reason::kill);
  }

 private:
  struct Stopping {
    size_t child;
    uint64_t generation;
  };

  // `gen` is the incarnation number as the directory and the child know it.
  void Emit(size_t child, uint64_t gen, std::string event, std::string reason,
            std::string decision) {
    context().Emit(base::SupervisionEvent{{},
                                          spec_->name,
                                          core_.child_name(child),
                                          gen,
                                          std::move(event),
                                          std::move(reason),
                                          std::move(decision)});
  }

  void Enqueue(std::vector<Action> actions) {
    for (auto& a : actions) queue_.push_back(std::move(a));
    Pump();
  }

  void Pump() {
    while (!stopping_ && !starting_ && !queue_.empty()) {
      Action a = std::move(queue_.front());
      queue_.pop_front();
      switch (a.kind) {
        case Action::Kind::kStart:
          StartChild(a.child, a.generation);
          break;
        case Action::Kind::kStop:
          StopChild(a.child, a.generation);
          break;
        case Action::Kind::kRestartAfter:
          Emit(a.child, generations_[a.child], "restart_scheduled", "",
               absl::StrCat("after ", a.delay.count() / 1000, "us"));
          delayed_send(this, a.delay, restart_atom::value, a.timer);
          break;
        case Action::Kind::kEscalate:
          context().Emit(base::SupervisionEvent{{},
                                                spec_->name,
                                                spec_->name,
                                                generation(),
                                                "escalate",
                                                a.reason,
                                                "stop supervisor; parent decides"});
          quit(StatusToError(absl::AbortedError(a.reason)));
          return;
      }
    }
    if (!stopping_ && !starting_ && queue_.empty() && quit_reason_) quit(*quit_reason_);
  }

  void StartChild(size_t i, uint64_t /*core_generation*/) {
    uint64_t gen = context().NextGeneration(spec_->children[i].name);
    generations_[i] = gen;
    if (spec_->children[i].placement) return StartRemoteChild(i, gen);
    auto h = internal::SpawnChild(system(), this, spec_->children[i], gen, context_ptr());
    if (!h.ok()) {  // validated up front; only resource exhaustion gets here
      Emit(i, gen, "exit", std::string(h.status().message()), "escalate");
      quit(StatusToError(h.status()));
      return;
    }
    handles_[i] = *h;
    Emit(i, gen, "start", "", "");
  }

  // Through the head; the queue waits for the answer, as it waits for a stop.
  void StartRemoteChild(size_t i, uint64_t gen) {
    const ChildSpec& c = spec_->children[i];
    caf::actor head = context().head();
    auto fail = [this, i, gen](const std::string& why) {
      starting_ = false;
      // A child that cannot be placed counts as a failed start: the core decides (retry with
      // backoff, or escalate past the intensity).
      std::string decision;
      auto actions =
          core_.OnExit(i, core_.generation(i), ExitKind::kError, clock().now(), &decision);
      Emit(i, gen, "exit", "error: remote spawn failed: " + why, decision);
      Enqueue(std::move(actions));
    };
    if (!head) return fail("this process is not connected to a cluster");
    starting_ = true;
    request(head, std::chrono::seconds(10), internal::spawn_atom::value, c.type, c.args, c.name,
            gen, *c.placement)
        .then(
            [this, i, gen](const caf::actor& h, const std::string& worker,
                           const std::string& /*direct*/) {
              starting_ = false;
              handles_[i] = h;
              monitor(h);
              ConnectTo(worker);  // its down message then does not depend on the head
              Emit(i, gen, "start", "", "on " + worker);
              Pump();
            },
            [this, fail](caf::error& e) { fail(system().render(e)); });
  }

  void StopChild(size_t i, uint64_t gen) {
    if (!handles_[i]) return;
    stopping_ = Stopping{i, gen};
    caf::anon_send_exit(handles_[i], caf::exit_reason::user_shutdown);
    delayed_send(this, spec_->children[i].shutdown_timeout, stop_timeout_atom::value,
                 static_cast<uint64_t>(i), gen);
  }

  void HandleDown(const caf::down_msg& dm) {
    for (size_t i = 0; i < handles_.size(); ++i) {
      if (handles_[i] && handles_[i].address() == dm.source) return OnChildDown(i, dm.reason);
    }
  }

  // The head's word that a remotely spawned child is gone (its worker may have died, and this
  // process may hold no connection to that worker that could tell it).
  void HandleRemoteDown(const std::string& name, uint64_t gen, const caf::error& reason,
                        const std::string& detail) {
    size_t i = core_.Find(name);
    if (i == core_.size() || !handles_[i] || generations_[i] != gen) return;
    OnChildDown(i, reason, detail);
  }

  void OnChildDown(size_t i, const caf::error& why, const std::string& detail = "") {
    handles_[i] = nullptr;
    uint64_t gen = generations_[i];
    if (stopping_ && stopping_->child == i) {
      Emit(i, gen, "stop", caf::to_string(why), "");
      stopping_.reset();
      Pump();
      return;
    }
    ExitKind kind = Classify(why);
    std::string decision;
    auto actions = core_.OnExit(i, core_.generation(i), kind, clock().now(), &decision);
    std::string reason = ToString(kind);
    if (kind == ExitKind::kError) absl::StrAppend(&reason, ": ", caf::to_string(why));
    if (!detail.empty()) absl::StrAppend(&reason, " (", detail, ")");
    Emit(i, gen, "exit", reason, decision);
    Enqueue(std::move(actions));
  }

  void HandleExit(const caf::exit_msg& em) {
    // Asked to stop (by the parent or the runtime): children in reverse order, then quit.
    if (quit_reason_) return;
    quit_reason_ = em.reason ? em.reason : caf::make_error(caf::exit_reason::user_shutdown);
    queue_.clear();
    Enqueue(core_.Shutdown());
  }

  std::shared_ptr<const SupervisorSpec> spec_;
  SupervisorCore core_;
  std::vector<caf::actor> handles_;
  std::vector<uint64_t> generations_;  // directory incarnation numbers, per child
  std::deque<Action> queue_;
  std::optional<Stopping> stopping_;
  bool starting_ = false;
  std::optional<caf::error> quit_reason_;
};

}  // namespace

ChildSpec ChildSpec::Actor(std::string name, std::string type, caf::message args,
                           RestartType restart) {
  ChildSpec c;
  c.name = std::move(name);
  c.type = std::move(type);
  c.args = std::move(args);
  c.restart = restart;
  return c;
}

ChildSpec ChildSpec::Supervisor(std::string name, SupervisorSpec spec) {
  ChildSpec c;
  c.name = std::move(name);
  c.supervisor = std::make_shared<const SupervisorSpec>(std::move(spec));
  c.shutdown_timeout = std::chrono::seconds(30);
  return c;
}

absl::Status Validate(const SupervisorSpec& spec, const ActorRegistry& registry) {
  auto where = [&](const std::string& child) {
    return absl::StrCat("supervisor '", spec.name, "'", child.empty() ? "" : ", child '", child,
                        child.empty() ? "" : "'");
  };
  if (spec.name.empty()) return absl::InvalidArgumentError("supervisor name must not be empty");
  if (spec.intensity.max_restarts < 0 || spec.intensity.period.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where(""), ": intensity expects max_restarts >= 0 and period > 0, got max_restarts=",
        spec.intensity.max_restarts, " period_ns=", spec.intensity.period.count()));
  }
  std::set<std::string> names;
  for (const auto& c : spec.children) {
    if (c.name.empty()) return absl::InvalidArgumentError(where("") + ": a child has no name");
    if (!names.insert(c.name).second) {
      return absl::InvalidArgumentError(where(c.name) + ": duplicate child name");
    }
    const BackoffPolicy& b = c.backoff;
    if (b.initial.count() < 0 || b.max < b.initial || b.multiplier < 1.0 || b.jitter < 0 ||
        b.jitter >= 1.0 || c.shutdown_timeout.count() <= 0) {
      return absl::InvalidArgumentError(
          where(c.name) +
          ": expected 0 <= backoff.initial <= backoff.max, multiplier >= 1, "
          "0 <= jitter < 1, shutdown_timeout > 0");
    }
    if (c.supervisor) {
      if (!c.type.empty()) {
        return absl::InvalidArgumentError(where(c.name) +
                                          ": set either an actor type or a supervisor, not both");
      }
      TROUPE_RETURN_IF_ERROR(Validate(*c.supervisor, registry));
      continue;
    }
    if (c.placement) continue;  // checked by the worker that spawns it
    if (auto bound = registry.Bind(c.type, c.args); !bound.ok()) {
      return absl::Status(bound.status().code(),
                          absl::StrCat(where(c.name), ": ", bound.status().message()));
    }
  }
  return absl::OkStatus();
}

namespace internal {

absl::StatusOr<caf::actor> SpawnChild(caf::actor_system& system, caf::event_based_actor* parent,
                                      const ChildSpec& spec, uint64_t generation,
                                      const std::shared_ptr<Context>& ctx) {
  caf::actor handle;
  if (spec.supervisor) {
    handle = parent ? parent->spawn<SupervisorActor, caf::monitored>(spec.name, generation, ctx,
                                                                     spec.supervisor)
                    : system.spawn<SupervisorActor>(spec.name, generation, ctx, spec.supervisor);
  } else {
    TROUPE_ASSIGN_OR_RETURN(auto init, ctx->registry().Bind(spec.type, spec.args));
    handle = parent ? parent->spawn<FunctionActor, caf::monitored>(spec.name, generation, ctx,
                                                                   std::move(init))
                    : system.spawn<FunctionActor>(spec.name, generation, ctx, std::move(init));
  }
  if (!spec.name.empty()) {
    ctx->Register(ActorRef{spec.name, generation, handle});
    std::weak_ptr<Context> weak = ctx;
    std::string name = spec.name;
    handle->attach_functor([weak, name, generation] {
      if (auto c = weak.lock()) c->Unregister(name, generation);
    });
  }
  return handle;
}

}  // namespace internal
}  // namespace troupe::runtime
