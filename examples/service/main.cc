// A small service that embeds troupe, for `troupe chaos actors`: a supervisor ("service", one for
// one) over three workers (worker-1..3) and a client loop that sends work to the workers by name
// for a few seconds, retrying a request on the next worker when one does not answer.
//
//   service [--seconds S] [--fragile] [runtime flags: --threads N ...]
//
// Exit status: 0 every request was answered (the service kept answering through its restarts);
// 1 a request went unanswered for --retry-s (3 s) of tries, or the supervisor gave up;
// 2 bad flags, or the runtime could not start (e.g. a malformed TROUPE_CHAOS_ACTORS).
// --fragile sets the supervisor's restart intensity to 0: the first worker that dies ends the
// service, so a chaos run has a failure to find and shrink.
//
//   troupe chaos actors --program 'service --fragile' --actors worker-1,worker-2,worker-3
#include <atomic>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "troupe/runtime/runtime.h"

namespace rt = troupe::runtime;
using work_atom = caf::atom_constant<caf::atom("work")>;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kUsage[] =
    "usage: service [--seconds S] [--fragile] [--retry-s S] [runtime flags]\n"
    "  exit 0: every request answered; 1: a request lost, or the service gave up; 2: bad flags";

struct Flags {
  double seconds = 3, retry_s = 3;
  bool fragile = false;
};

bool ParseFlags(const std::vector<std::string>& args, Flags* f) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    double* number = a == "--seconds" ? &f->seconds : a == "--retry-s" ? &f->retry_s : nullptr;
    if (a == "--fragile") {
      f->fragile = true;
    } else if (number != nullptr && i + 1 < args.size() && absl::SimpleAtod(args[i + 1], number) &&
               *number > 0) {
      ++i;
    } else {
      std::cerr << "service: unexpected argument '" << a << "' (or its value)\n" << kUsage << "\n";
      return false;
    }
  }
  return true;
}

// Sends request `x` to worker-(first + 1), then the next ones in turn, until one answers x * its
// id or `retry` has passed (or the supervisor is gone). False when the request was lost.
bool Request(rt::Runtime& runtime, int32_t x, int first, Clock::duration retry, int64_t* tries) {
  const Clock::time_point give_up = Clock::now() + retry;
  for (int k = first;; ++k) {
    const int32_t id = 1 + k % 3;
    ++*tries;
    if (auto ref = runtime.Lookup("worker-" + std::to_string(id)); ref.ok()) {
      auto reply = runtime.Call(*ref, caf::make_message(work_atom::value, x),
                                std::chrono::milliseconds(250));
      if (reply.ok() && reply->match_elements<int32_t>() && reply->get_as<int32_t>(0) == x * id) {
        return true;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // between incarnations
    }
    if (Clock::now() >= give_up || !runtime.Lookup("service").ok()) return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  rt::ActorRegistry registry;
  (void)registry.Register<int32_t>("worker", [](rt::Actor* /*self*/, int32_t id) {
    return caf::behavior{[=](work_atom, int32_t x) { return x * id; }};
  });
  rt::RuntimeOptions options;
  options.threads = 4;  // a stopped worker blocks a scheduler thread: leave the others some
  rt::ConfigRegistry config;
  options.Register(config);
  std::vector<std::string> rest;
  absl::Status parsed = config.LoadEnvironment();
  if (parsed.ok()) parsed = config.ParseFlags(argc, argv, &rest);
  Flags flags;
  if (!parsed.ok() || !ParseFlags(rest, &flags)) {
    if (!parsed.ok()) std::cerr << "service: " << parsed.message() << "\n";
    return 2;
  }
  auto runtime = rt::Runtime::Create(std::move(registry), options);
  if (!runtime.ok()) {
    std::cerr << "service: " << runtime.status().message() << "\n";
    return 2;
  }
  std::atomic<int64_t> restarts{0};
  (*runtime)->SetEventSink([&](const troupe::base::SupervisionEvent& e) {
    std::cerr << troupe::base::FormatEvent(e) << std::endl;
    if (e.event == "start" && e.generation > 1) ++restarts;
  });
  rt::SupervisorSpec spec;
  spec.name = "service";
  spec.strategy = rt::Strategy::kOneForOne;
  spec.intensity = flags.fragile ? rt::Intensity{0, std::chrono::seconds(1)}
                                 : rt::Intensity{1000, std::chrono::seconds(1)};
  for (int32_t i = 1; i <= 3; ++i) {
    spec.children.push_back(
        rt::ChildSpec::Actor("worker-" + std::to_string(i), "worker", caf::make_message(i)));
  }
  if (auto sup = (*runtime)->StartSupervisor(spec); !sup.ok()) {
    std::cerr << "service: " << sup.status().message() << "\n";
    return 2;
  }
  const auto retry =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(flags.retry_s));
  const Clock::time_point end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(flags.seconds));
  int64_t answered = 0, tries = 0;
  std::string lost;
  for (int32_t x = 1; Clock::now() < end && lost.empty(); ++x) {
    int64_t these = 0;
    if (Request(**runtime, x, x % 3, retry, &these)) {
      ++answered;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else {
      lost = "request " + std::to_string(x) + " lost after " + std::to_string(these) + " tries" +
             ((*runtime)->Lookup("service").ok() ? "" : " (the supervisor gave up)");
    }
    tries += these;
  }
  (*runtime)->Shutdown();  // its events first: the verdict is the last line
  if (!lost.empty()) {
    std::cerr << "service: " << lost << "; answered=" << answered << " restarts=" << restarts
              << std::endl;
    return 1;
  }
  std::cout << "service: answered=" << answered << " retries=" << tries - answered
            << " restarts=" << restarts << std::endl;
  return 0;
}
