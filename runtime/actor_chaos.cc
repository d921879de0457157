#include "internal/actor_chaos.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "internal/context.h"
#include "troupe/base/events.h"

namespace troupe::runtime::internal {

namespace {

using std::chrono::milliseconds;

// One line appended in one write(2): lines of several processes sharing the file stay whole.
void AppendLine(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string text = line + "\n";
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ActorChaos>> ActorChaos::FromEnvironment(
    std::shared_ptr<Context> ctx, const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) -> std::string {
    const char* v = getenv ? getenv(name) : std::getenv(name);
    return v == nullptr ? "" : v;
  };
  const std::string schedule = get("TROUPE_CHAOS_ACTORS"), list = get("TROUPE_CHAOS_ACTORS_LIST");
  absl::StatusOr<std::vector<ActorFault>> faults = ParseActorFaults(schedule);
  if (!faults.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable TROUPE_CHAOS_ACTORS: ", faults.status().message()));
  }
  if (faults->empty() && list.empty()) return nullptr;
  return std::unique_ptr<ActorChaos>(
      new ActorChaos(std::move(ctx), *std::move(faults), get("TROUPE_CHAOS_LOG"), list));
}

ActorChaos::ActorChaos(std::shared_ptr<Context> ctx, std::vector<ActorFault> faults,
                       std::string log_path, std::string list_path)
    : ctx_(std::move(ctx)),
      faults_(std::move(faults)),
      log_path_(std::move(log_path)),
      list_path_(std::move(list_path)),
      start_(std::chrono::steady_clock::now()) {
  if (!faults_.empty()) thread_ = std::thread([this] { Run(); });
}

void ActorChaos::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (list_path_.empty()) return;
  std::vector<std::string> names;
  for (const ActorRef& ref : ctx_->Directory()) names.push_back(ref.name);
  std::sort(names.begin(), names.end());
  std::ofstream out(list_path_, std::ios::trunc);
  for (const std::string& n : names) out << n << "\n";
}

void ActorChaos::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (const ActorFault& f : faults_) {  // in at_ms order
    if (cv_.wait_until(lock, start_ + milliseconds(f.at_ms), [this] { return stop_; })) return;
    lock.unlock();
    Fire(f);
    lock.lock();
  }
}

void ActorChaos::Fire(const ActorFault& f) {
  const auto now = std::chrono::steady_clock::now();
  const auto until = start_ + milliseconds(f.at_ms + f.for_ms);
  const std::optional<ActorRef> ref = ctx_->Lookup(f.actor);
  bool found = ref.has_value();
  if (found) {
    switch (f.kind) {
      case ActorFault::Kind::kKill:
        found = ctx_->faults().KillActor(f.actor).ok();  // NotFound: it ended just now
        break;
      case ActorFault::Kind::kStop:
        ctx_->faults().HangNextMessageUntil(f.actor, until);
        break;
      case ActorFault::Kind::kDelay:
        ctx_->faults().DelayMessagesUntil({f.actor, "", -1}, milliseconds(f.delay_ms), until);
        break;
    }
  }
  base::SupervisionEvent e{{}, "chaos", f.actor, found ? ref->generation : 0, "chaos_fault",
                           "", ""};
  e.Set("kind", ActorFaultKindName(f.kind))
      .Set("at_ms", f.at_ms)
      .Set("fired_ms", std::chrono::duration_cast<milliseconds>(now - start_).count())
      .Set("result", found ? "ok" : "no_actor")
      .Set("fault", f.ToString());
  e.wall_time = std::chrono::system_clock::now();
  if (!log_path_.empty()) AppendLine(log_path_, base::FormatEvent(e));
  ctx_->Emit(std::move(e));
}

}  // namespace troupe::runtime::internal
