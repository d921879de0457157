#include "internal/context.h"

#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "caf/abstract_actor.hpp"
#include "caf/actor.hpp"

namespace troupe::runtime {

std::string FormatEvent(const SupervisionEvent& e) {
  using namespace std::chrono;
  auto us = duration_cast<microseconds>(e.wall_time.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  auto quote = [](const std::string& s) {
    return s.find_first_of(" =\"") == std::string::npos && !s.empty() ? s
                                                                      : absl::StrCat("\"", s, "\"");
  };
  std::string line = absl::StrCat("ts=", ts, ".", absl::Dec(us % 1000000, absl::kZeroPad6),
                                  "Z supervisor=", quote(e.supervisor), " child=", quote(e.child),
                                  " gen=", e.generation, " event=", e.event);
  if (!e.reason.empty()) absl::StrAppend(&line, " reason=", quote(e.reason));
  if (!e.decision.empty()) absl::StrAppend(&line, " decision=", quote(e.decision));
  return line;
}

namespace internal {

void Context::SetEventSink(EventSink sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = std::move(sink);
}

void Context::Emit(SupervisionEvent e) {
  e.wall_time = std::chrono::system_clock::now();
  EventSink sink;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sink = sink_;
  }
  if (sink) {
    sink(e);
  } else {
    std::string line = FormatEvent(e) + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

void Context::Register(const ActorRef& ref) {
  std::lock_guard<std::mutex> lock(mu_);
  directory_[ref.name] = ref;
}

void Context::Unregister(const std::string& name, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = directory_.find(name);
  if (it != directory_.end() && it->second.generation == generation) directory_.erase(it);
}

std::optional<ActorRef> Context::Lookup(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = directory_.find(name);
  if (it == directory_.end()) return std::nullopt;
  return it->second;
}

uint64_t Context::NextGeneration(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return ++generations_[name];
}

void Context::Track(const std::shared_ptr<ActorStats>& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  tracked_[stats.get()] = stats;
}

void Context::Untrack(const ActorStats* stats) {
  std::lock_guard<std::mutex> lock(mu_);
  tracked_.erase(stats);
}

std::vector<std::shared_ptr<ActorStats>> Context::Tracked() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ActorStats>> out;
  for (const auto& [p, s] : tracked_) out.push_back(s);
  return out;
}

void Context::SetHead(caf::actor head) {
  std::lock_guard<std::mutex> lock(mu_);
  head_ = std::move(head);
}

caf::actor Context::head() {
  std::lock_guard<std::mutex> lock(mu_);
  return head_;
}

void Context::KeepAlive(std::shared_ptr<void> x) {
  std::lock_guard<std::mutex> lock(mu_);
  keep_alive_.push_back(std::move(x));
}

void Context::ReleaseKeepAlive() {
  std::vector<std::shared_ptr<void>> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop.swap(keep_alive_);
  }
}

void Context::Own(const caf::actor& handle) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_owned_++;
    owned_[id] = handle;
  }
  std::weak_ptr<Context> weak = weak_from_this();
  handle->attach_functor([weak, id] {
    if (auto c = weak.lock()) {
      std::lock_guard<std::mutex> lock(c->mu_);
      c->owned_.erase(id);
    }
  });
}

std::vector<caf::actor> Context::Owned() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<caf::actor> out;
  for (const auto& [id, h] : owned_) out.push_back(h);
  return out;
}

void Context::ClearDirectory() {
  std::lock_guard<std::mutex> lock(mu_);
  directory_.clear();
  head_ = nullptr;
}

}  // namespace internal
}  // namespace troupe::runtime
