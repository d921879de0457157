#include "troupe/runtime/metadata_sim.h"

#include <httplib.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace troupe::runtime {

struct MetadataSimulator::Impl {
  httplib::Server server;
  int port = 0;
  std::thread thread;
  mutable std::mutex mu;
  std::condition_variable changed;
  bool preempted = false, closing = false;
  absl::Time ends;
  int64_t token_epoch = 0, tokens = 0, token_requests = 0, notice_requests = 0;

  std::string Etag() const { return preempted ? "\"e1\"" : "\"e0\""; }
};

MetadataSimulator::MetadataSimulator() : impl_(std::make_unique<Impl>()) {
  Impl* i = impl_.get();
  i->server.Put("/latest/api/token", [i](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> l(i->mu);
    if (!req.has_header("X-aws-ec2-metadata-token-ttl-seconds")) {
      res.status = 400;
      return;
    }
    ++i->token_requests;
    res.set_content(absl::StrCat("tok-", i->token_epoch, "-", ++i->tokens), "text/plain");
  });
  i->server.Get("/latest/meta-data/spot/instance-action", [i](const httplib::Request& req,
                                                              httplib::Response& res) {
    std::lock_guard<std::mutex> l(i->mu);
    if (!absl::StartsWith(req.get_header_value("X-aws-ec2-metadata-token"),
                          absl::StrCat("tok-", i->token_epoch, "-"))) {
      res.status = 401;
      return;
    }
    ++i->notice_requests;
    if (!i->preempted) {
      res.status = 404;
      return;
    }
    res.set_content(
        absl::StrCat("{\"action\": \"terminate\", \"time\": \"",
                     absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", i->ends, absl::UTCTimeZone()), "\"}"),
        "application/json");
  });
  i->server.Get("/computeMetadata/v1/instance/preempted",
                [i](const httplib::Request& req, httplib::Response& res) {
                  if (req.get_header_value("Metadata-Flavor") != "Google") {
                    res.status = 403;
                    return;
                  }
                  std::unique_lock<std::mutex> l(i->mu);
                  if (req.get_param_value("wait_for_change") == "true") {
                    int64_t timeout_s = 60;
                    (void)absl::SimpleAtoi(req.get_param_value("timeout_sec"), &timeout_s);
                    const std::string last = req.get_param_value("last_etag");
                    i->changed.wait_for(l, std::chrono::seconds(timeout_s),
                                        [&] { return i->closing || i->Etag() != last; });
                  }
                  ++i->notice_requests;
                  res.set_header("ETag", i->Etag());
                  res.set_content(i->preempted ? "TRUE" : "FALSE", "text/plain");
                });
  i->port = i->server.bind_to_any_port("127.0.0.1");
  if (i->port < 0) {  // no loopback port at all: nothing this process can go on without
    std::fprintf(stderr, "metadata simulator: cannot bind a port on 127.0.0.1\n");
    std::abort();
  }
  i->thread = std::thread([i] { i->server.listen_after_bind(); });
  // Until its accept loop runs, stop() would be lost (and the destructor would wait forever).
  while (!i->server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetadataSimulator::~MetadataSimulator() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->closing = true;
  }
  impl_->changed.notify_all();
  impl_->server.stop();
  impl_->thread.join();
}

std::string MetadataSimulator::endpoint() const {
  return absl::StrCat("http://127.0.0.1:", impl_->port);
}

void MetadataSimulator::Preempt(std::chrono::seconds left) {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->preempted = true;
    impl_->ends = absl::Now() + absl::FromChrono(left);
  }
  impl_->changed.notify_all();
}

void MetadataSimulator::ExpireTokens() {
  std::lock_guard<std::mutex> l(impl_->mu);
  ++impl_->token_epoch;
}

int64_t MetadataSimulator::token_requests() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->token_requests;
}

int64_t MetadataSimulator::notice_requests() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->notice_requests;
}

}  // namespace troupe::runtime
