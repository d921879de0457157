#include "job_reporter.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "caf/all.hpp"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/status.h"
#include "troupe/train/job_events.h"
#include "troupe/train/preempted.h"

namespace troupe::actors {
namespace {

constexpr auto kAnswer = std::chrono::seconds(5);

// "succeeded", "stopped" (`troupe job stop`: Cancelled), "preempted" or "failed".
const char* EndState(const absl::StatusOr<JobReport>& r) {
  if (r.ok()) return "succeeded";
  if (train::IsPreempted(r.status())) return "preempted";
  return r.status().code() == absl::StatusCode::kCancelled ? "stopped" : "failed";
}

}  // namespace

JobReporter::JobReporter(const train::JobSpec& spec, std::string job_id)
    : id_(std::move(job_id)),
      name_(spec.name),
      spec_toml_(spec.ToToml()),
      log_path_(train::EventLogPath(spec.work_dir)),
      steps_(spec.steps) {}

absl::Status JobReporter::Connect(caf::actor_system& sys, caf::actor head, caf::actor driver) {
  sys_ = &sys;
  driver_ = std::move(driver);
  TROUPE_RETURN_IF_ERROR(Register(head));
  head_ = std::move(head);
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

JobReporter::~JobReporter() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status JobReporter::Register(const caf::actor& head) {
  caf::scoped_actor self{*sys_};
  absl::Status status;
  self->request(head, kAnswer, runtime::job_register_atom::value, id_, name_, spec_toml_, steps_,
                static_cast<int64_t>(getpid()), std::string(), driver_)
      .receive([&](std::string& id) { id_ = std::move(id); },
               [&](caf::error& e) { status = runtime::ErrorToStatus(e, "head"); });
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("registering the job with the cluster's head: ",
                                                    status.message()));
  }
  return absl::OkStatus();
}

void JobReporter::SetHead(caf::actor head) {
  {
    std::lock_guard<std::mutex> l(mu_);
    head_ = std::move(head);
    reregister_ = true;
  }
  cv_.notify_all();
}

void JobReporter::Line(std::string line) {
  std::lock_guard<std::mutex> l(mu_);
  lines_.push_back(std::move(line));
}

// The event log from offset_ on, in complete lines, to `head`; then the progress lines.
void JobReporter::Flush(const caf::actor& head) {
  std::ifstream in(log_path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset_));
  std::vector<std::string> events;
  std::string line;
  while (in && std::getline(in, line)) {
    if (in.eof()) break;  // no newline yet: the writer is mid-line, read it whole next time
    offset_ += line.size() + 1;
    events.push_back(std::move(line));
    if (events.size() == 512) {
      caf::anon_send(head, runtime::job_events_atom::value, id_, std::move(events));
      events.clear();
    }
  }
  if (!events.empty()) caf::anon_send(head, runtime::job_events_atom::value, id_, events);
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> l(mu_);
    lines.swap(lines_);
  }
  if (!lines.empty()) caf::anon_send(head, runtime::job_log_atom::value, id_, std::move(lines));
}

void JobReporter::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::milliseconds(200));
    if (stop_) break;
    caf::actor head = head_;
    const bool again = reregister_;
    reregister_ = false;
    l.unlock();
    if (again) {
      offset_ = 0;  // the new head gets the whole log
      if (absl::Status s = Register(head); !s.ok()) {
        l.lock();
        // Asked again next time, unless the head says the job has ended (stopped meanwhile).
        reregister_ = s.code() != absl::StatusCode::kFailedPrecondition;
        if (!reregister_) stop_ = true;
        continue;
      }
    }
    Flush(head);
    l.lock();
  }
}

void JobReporter::End(const absl::StatusOr<JobReport>& report) {
  if (sys_ == nullptr) return;  // never registered
  caf::actor head;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    head = head_;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Flush(head);
  std::string json;
  if (report.ok()) {
    const JobReport& r = *report;
    json = absl::StrFormat(
        R"({"steps_lost": %d, "crc32c": "%08x", "recovery_s": %.6f, "committed_steps": %d, )"
        R"("final_world": %d, "generations": %d, "tokens_per_s": %.3f, "final_loss": %.6f)",
        r.steps_lost, r.final_params_crc32c, r.recovery_seconds, r.committed_steps, r.final_world,
        r.generations, r.tokens_per_second, r.losses.empty() ? 0.0 : r.losses.back());
    if (r.val_step >= 0) absl::StrAppendFormat(&json, R"(, "val_loss": %.6f)", r.val_loss);
    json += "}";
  }
  caf::scoped_actor self{*sys_};
  self->request(head, kAnswer, runtime::job_end_atom::value, id_, std::string(EndState(report)),
                report.ok() ? std::string() : std::string(report.status().message()), json)
      .receive([](bool) {}, [](caf::error&) {});
}

void LineTee::Put(std::thread::id thread, char c) {
  std::string& line = pending_[thread];
  line += c;
  if (c != '\n') return;
  out_.write(line.data(), static_cast<std::streamsize>(line.size())).flush();  // one write
  line.pop_back();
  std::string whole = std::move(line);
  pending_.erase(thread);
  line_(std::move(whole));
}

LineTee::~LineTee() {
  std::lock_guard<std::mutex> l(mu_);
  while (!pending_.empty()) Put(pending_.begin()->first, '\n');  // ends and erases it
}

int LineTee::overflow(int c) {
  if (c == traits_type::eof()) return traits_type::not_eof(c);
  std::lock_guard<std::mutex> l(mu_);
  Put(std::this_thread::get_id(), static_cast<char>(c));
  return c;
}

std::streamsize LineTee::xsputn(const char* s, std::streamsize n) {
  std::lock_guard<std::mutex> l(mu_);
  const std::thread::id thread = std::this_thread::get_id();
  for (std::streamsize i = 0; i < n; ++i) Put(thread, s[i]);
  return n;
}

int LineTee::sync() {
  std::lock_guard<std::mutex> l(mu_);
  out_.flush();
  return 0;
}

}  // namespace troupe::actors
