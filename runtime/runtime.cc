#include "troupe/runtime/runtime.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "caf/scheduler/test_coordinator.hpp"
#include "internal/actor_chaos.h"
#include "internal/context.h"
#include "internal/direct_pool.h"
#include "internal/spawn.h"
#include "internal/tls.h"
#include "troupe/base/crash_point.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/log.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime {

void RuntimeOptions::Register(ConfigRegistry& registry) {
  registry.AddInt("threads", &threads, "CAF scheduler worker threads", InRange(1, 1024));
  registry.AddString("scheduler", &scheduler, "CAF scheduler policy",
                     OneOf({"stealing", "sharing", "testing"}));
  registry.AddDuration("shutdown_timeout", &shutdown_timeout,
                       "how long Shutdown waits for actors before killing them", Positive());
  registry.AddBool("log_events", &log_events, "write supervision events to stderr");
  registry.AddString("tls_ca", &tls_ca, "cluster CA certificate (PEM); enables mutual TLS");
  registry.AddString("tls_cert", &tls_cert, "this process's certificate (PEM), signed by the CA");
  registry.AddString("tls_key", &tls_key, "this process's private key (PEM)");
  registry.AddString("crash_at", &crash_at,
                     "fault injection: SIGKILL this process at crash point NAME[:HIT]");
  registry.AddString("log_level", &log_level, "lowest level of log line written",
                     OneOf({"debug", "info", "warn", "error"}));
}

std::vector<std::string> RuntimeOptions::TlsArgs() const {
  if (!tls()) return {};
  return {"--tls_ca", tls_ca, "--tls_cert", tls_cert, "--tls_key", tls_key};
}

Runtime::Runtime(RuntimeOptions options, ActorRegistry registry)
    : options_(std::move(options)),
      ctx_(std::make_shared<internal::Context>(std::move(registry))) {}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(ActorRegistry registry,
                                                         RuntimeOptions options) {
  // Validate through the registry's validators so code-set values get the same checks.
  ConfigRegistry check;
  RuntimeOptions copy = options;
  copy.Register(check);
  for (const char* name : {"threads", "scheduler", "shutdown_timeout", "log_level"}) {
    TROUPE_RETURN_IF_ERROR(check.Set(name, check.Get(name), "RuntimeOptions"));
  }
  if (!options.crash_at.empty()) {
    std::pair<std::string, std::string> p =
        absl::StrSplit(options.crash_at, absl::MaxSplits(':', 1));
    uint64_t hit = 1;
    if (p.first.empty() || (!p.second.empty() && (!absl::SimpleAtoi(p.second, &hit) || hit == 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "option 'crash_at': expected NAME or NAME:HIT (HIT >= 1), got '", options.crash_at, "'"));
    }
    base::ArmCrashPoint(p.first, hit);
  }
  if (LogLevel level; ParseLogLevel(options.log_level, &level)) SetLogLevel(level);
  auto config = std::make_unique<caf::actor_system_config>();
  registry.ApplyMessageTypes(*config);
  RegisterStatusErrors(*config);
  std::unique_ptr<Runtime> rt(new Runtime(options, std::move(registry)));
  rt->config_ = std::move(config);
  rt->config_->set("scheduler.max-threads", static_cast<size_t>(options.threads));
  rt->config_->set("scheduler.policy", caf::atom_from_string(options.scheduler));
  rt->config_->set("logger.verbosity", caf::atom("quiet"));
  bool tls = !options.tls_ca.empty() || !options.tls_cert.empty() || !options.tls_key.empty();
  if (tls) {
    if (options.tls_ca.empty() || options.tls_cert.empty() || options.tls_key.empty()) {
      return absl::InvalidArgumentError(
          "options tls_ca, tls_cert and tls_key: expected all three or none");
    }
    TROUPE_RETURN_IF_ERROR(
        internal::CheckTlsFiles(options.tls_ca, options.tls_cert, options.tls_key));
  }
  if (options.network) {
    rt->config_->load<caf::io::middleman>();
    RegisterClusterTypes(*rt->config_);
  }
  rt->system_ = std::make_unique<caf::actor_system>(*rt->config_);
  rt->direct_pool_ = std::make_unique<internal::DirectPool>(*rt);
  if (!options.log_events) rt->ctx_->SetEventSink([](const base::SupervisionEvent&) {});
  std::weak_ptr<internal::Context> weak = rt->ctx_;
  rt->ctx_->faults().SetKiller([weak](const std::string& name) -> absl::Status {
    auto ctx = weak.lock();
    if (!ctx) return absl::FailedPreconditionError("runtime is gone");
    auto ref = ctx->Lookup(name);
    if (!ref) return absl::NotFoundError(absl::StrCat("no actor named '", name, "' to kill"));
    caf::anon_send_exit(ref->handle, caf::exit_reason::kill);
    return absl::OkStatus();
  });
  TROUPE_ASSIGN_OR_RETURN(rt->chaos_, internal::ActorChaos::FromEnvironment(rt->ctx_));
  return rt;
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::FromArgs(ActorRegistry registry, int argc,
                                                           const char* const* argv,
                                                           std::vector<std::string>* rest) {
  RuntimeOptions options;
  ConfigRegistry config;
  options.Register(config);
  TROUPE_RETURN_IF_ERROR(config.LoadEnvironment());
  TROUPE_RETURN_IF_ERROR(config.ParseFlags(argc, argv, rest));
  return Create(std::move(registry), std::move(options));
}

Runtime::~Runtime() { Shutdown(); }

absl::StatusOr<caf::actor> Runtime::Spawn(const std::string& type, const caf::message& args) {
  ChildSpec spec = ChildSpec::Actor("", type, args);
  auto h = internal::SpawnChild(*system_, nullptr, spec, 1, ctx_);
  if (h.ok()) ctx_->Own(*h);
  return h;
}

absl::StatusOr<ActorRef> Runtime::SpawnNamed(const std::string& name, const std::string& type,
                                             const caf::message& args) {
  if (name.empty()) return absl::InvalidArgumentError("SpawnNamed: name must not be empty");
  if (ctx_->Lookup(name)) {
    return absl::AlreadyExistsError(absl::StrCat("an actor named '", name, "' already exists"));
  }
  uint64_t gen = ctx_->NextGeneration(name);
  TROUPE_ASSIGN_OR_RETURN(
      auto h,
      internal::SpawnChild(*system_, nullptr, ChildSpec::Actor(name, type, args), gen, ctx_));
  ctx_->Own(h);
  return ActorRef{name, gen, h};
}

absl::StatusOr<ActorRef> Runtime::StartSupervisor(const SupervisorSpec& spec) {
  TROUPE_RETURN_IF_ERROR(Validate(spec, ctx_->registry()));
  if (ctx_->Lookup(spec.name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("an actor named '", spec.name, "' already exists"));
  }
  ChildSpec root = ChildSpec::Supervisor(spec.name, spec);
  uint64_t gen = ctx_->NextGeneration(spec.name);
  TROUPE_ASSIGN_OR_RETURN(auto h, internal::SpawnChild(*system_, nullptr, root, gen, ctx_));
  ctx_->Own(h);
  return ActorRef{spec.name, gen, h};
}

absl::StatusOr<ActorRef> Runtime::Lookup(const std::string& name) const {
  auto ref = ctx_->Lookup(name);
  if (!ref) return absl::NotFoundError(absl::StrCat("no actor named '", name, "'"));
  return *ref;
}

FaultInjector& Runtime::faults() { return ctx_->faults(); }

void Runtime::SetEventSink(base::EventSink sink) { ctx_->SetEventSink(std::move(sink)); }

void Runtime::Shutdown() {
  if (shut_down_ || !system_) return;
  shut_down_ = true;
  if (chaos_) chaos_->Stop();  // no fault fires while the actors stop
  if (options_.scheduler != "testing") {
    caf::scoped_actor self{*system_};
    auto owned = ctx_->Owned();
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) {
      self->monitor(*it);
      self->send_exit(*it, caf::exit_reason::user_shutdown);
      bool down = false;
      self->receive([&](caf::down_msg&) { down = true; },
                    caf::after(options_.shutdown_timeout) >> [] {});
      if (!down) self->send_exit(*it, caf::exit_reason::kill);
    }
  } else {
    // Deterministic test scheduler: nothing runs unless pumped, so pump until all are gone.
    auto owned = ctx_->Owned();
    for (auto it = owned.rbegin(); it != owned.rend(); ++it)
      caf::anon_send_exit(*it, caf::exit_reason::kill);
    auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(system_->scheduler());
    sched.run();
  }
  ctx_->ClearDirectory();
  direct_pool_.reset();
  system_.reset();  // waits for every actor
  ctx_->ReleaseKeepAlive();
  config_.reset();
}

}  // namespace troupe::runtime
