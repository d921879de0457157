#include "internal/context.h"

#include <cstdio>

#include "caf/abstract_actor.hpp"
#include "caf/actor.hpp"

namespace troupe::runtime {

namespace internal {

void Context::SetEventSink(base::EventSink sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = std::move(sink);
}

void Context::Emit(base::SupervisionEvent e) {
  e.wall_time = std::chrono::system_clock::now();
  base::EventSink sink;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sink = sink_;
  }
  if (sink) {
    sink(e);
  } else {
    std::string line = base::FormatEvent(e) + "\n";
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

std::vector<ActorRef> Context::Directory() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ActorRef> out;
  for (const auto& [name, ref] : directory_) out.push_back(ref);
  return out;
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

void Context::SetMesh(caf::actor mesh) {
  std::lock_guard<std::mutex> lock(mu_);
  mesh_ = std::move(mesh);
}

caf::actor Context::mesh() {
  std::lock_guard<std::mutex> lock(mu_);
  return mesh_;
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
  mesh_ = nullptr;
}

}  // namespace internal
}  // namespace troupe::runtime
