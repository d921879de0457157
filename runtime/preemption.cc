#include "internal/preemption.h"

#include <httplib.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "internal/enum_text.h"
#include "troupe/runtime/log.h"

namespace troupe::runtime::internal {

const char* Name(PreemptionSource s) {
  switch (s) {
    case PreemptionSource::kNone:
      return "none";
    case PreemptionSource::kSigterm:
      return "sigterm";
    case PreemptionSource::kAws:
      return "aws";
    case PreemptionSource::kGce:
      return "gce";
  }
  return "?";
}

absl::StatusOr<PreemptionSource> ParsePreemptionSource(const std::string& text) {
  constexpr PreemptionSource kAll[] = {PreemptionSource::kNone, PreemptionSource::kSigterm,
                                       PreemptionSource::kAws, PreemptionSource::kGce};
  return ParseEnum("--preemption_source", text, kAll);
}

std::string DefaultMetadataEndpoint(PreemptionSource s) {
  if (s == PreemptionSource::kAws) return "http://169.254.169.254";
  if (s == PreemptionSource::kGce) return "http://metadata.google.internal";
  return "";
}

namespace {

// What each cloud promises when its notice does not say: AWS two minutes, GCE thirty seconds.
constexpr Duration kAwsNotice = std::chrono::minutes(2);
constexpr Duration kGceNotice = std::chrono::seconds(30);

// An instance-action document: {"action": "terminate", "time": "2026-11-26T10:00:00Z"}. Any 200
// answer is a notice — a body this cannot read still means the machine is going, so it counts,
// with AWS's two minutes.
PreemptionNotice AwsNotice(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  std::string action = "?", when;
  if (j.is_object()) {
    if (j.contains("action") && j["action"].is_string()) action = j["action"];
    if (j.contains("time") && j["time"].is_string()) when = j["time"];
  }
  PreemptionNotice n{kAwsNotice, absl::StrCat("aws spot instance-action ", action)};
  absl::Time t;
  std::string err;
  if (!when.empty() && absl::ParseTime(absl::RFC3339_full, when, &t, &err)) {
    n.left = std::max(Duration::zero(), absl::ToChronoNanoseconds(t - absl::Now()));
    absl::StrAppend(&n.detail, " at ", when);
  } else {
    absl::StrAppend(&n.detail, " (no readable time in '", body.substr(0, 80),
                    "': assuming two minutes)");
  }
  return n;
}

std::string Describe(const httplib::Result& r) {
  if (!r) return httplib::to_string(r.error());
  return absl::StrCat("HTTP ", r->status);
}

}  // namespace

struct PreemptionWatcher::Impl {
  Impl(Options o, std::function<void(const PreemptionNotice&)> cb)
      : options(std::move(o)), on_notice(std::move(cb)), client(options.endpoint) {}

  // Waits `d`, or until stopped: false once stopped.
  bool Sleep(Duration d) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, d, [&] { return stop; });
    return !stop;
  }
  bool Stopped() {
    std::lock_guard<std::mutex> l(mu);
    return stop;
  }
  // The first failure to reach the endpoint is logged; later ones only once it answered again.
  void Unreachable(const std::string& what) {
    if (!warned && !Stopped()) {
      LogWarn("preemption",
              absl::StrCat(Name(options.source), " metadata at ", options.endpoint, ": ", what,
                           "; retrying every ", FormatDuration(options.poll)));
    }
    warned = true;
  }
  void Notice(const PreemptionNotice& n) {
    if (!Stopped()) on_notice(n);
  }

  void RunAws() {
    std::string token;
    while (!Stopped()) {
      if (token.empty()) {
        httplib::Result r =
            client.Put("/latest/api/token", {{"X-aws-ec2-metadata-token-ttl-seconds", "21600"}}, "",
                       "text/plain");
        if (r && r->status == 200 && !r->body.empty()) {
          token = r->body;
        } else {
          Unreachable(absl::StrCat("PUT /latest/api/token: ", Describe(r)));
          if (!Sleep(options.poll)) return;
          continue;
        }
      }
      httplib::Result r = client.Get("/latest/meta-data/spot/instance-action",
                                     {{"X-aws-ec2-metadata-token", token}});
      if (r && r->status == 200) return Notice(AwsNotice(r->body));
      if (r && r->status == 401) {
        token.clear();  // the session token expired: a new one next time
      } else if (r && r->status == 404) {
        warned = false;  // no notice yet, and the endpoint answers
      } else {
        Unreachable(absl::StrCat("GET /latest/meta-data/spot/instance-action: ", Describe(r)));
      }
      if (!Sleep(options.poll)) return;
    }
  }

  // "FALSE" with an ETag, then a hanging GET with that ETag that answers when the value changes
  // (or after timeout_sec, unchanged).
  void RunGce() {
    const httplib::Headers h = {{"Metadata-Flavor", "Google"}};
    const int64_t wait_s = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::seconds>(options.poll).count());
    client.set_read_timeout(std::chrono::seconds(wait_s + 5));
    const std::string path = "/computeMetadata/v1/instance/preempted";
    std::string etag;
    while (!Stopped()) {
      httplib::Params wait;
      if (!etag.empty()) {
        wait = {{"wait_for_change", "true"},
                {"last_etag", etag},
                {"timeout_sec", absl::StrCat(wait_s)}};
      }
      httplib::Result r = client.Get(path, wait, h);
      if (r && r->status == 200) {
        warned = false;
        if (absl::StripAsciiWhitespace(r->body) == "TRUE") {
          return Notice({kGceNotice, "gce instance/preempted TRUE"});
        }
        const std::string next = r->get_header_value("ETag");
        // A server without ETags cannot be waited on: polled instead.
        if ((next.empty() || next == etag) && !Sleep(options.poll)) return;
        etag = next;
        continue;
      }
      Unreachable(absl::StrCat("GET ", path, ": ", Describe(r)));
      etag.clear();
      if (!Sleep(options.poll)) return;
    }
  }

  Options options;
  std::function<void(const PreemptionNotice&)> on_notice;
  httplib::Client client;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false, done = false, warned = false;
  std::thread thread;
};

absl::StatusOr<std::unique_ptr<PreemptionWatcher>> PreemptionWatcher::Start(
    Options options, std::function<void(const PreemptionNotice&)> on_notice) {
  if (options.source != PreemptionSource::kAws && options.source != PreemptionSource::kGce) {
    return absl::InvalidArgumentError(absl::StrCat("--preemption_source: ", Name(options.source),
                                                   " has no metadata endpoint to watch"));
  }
  if (options.endpoint.empty()) options.endpoint = DefaultMetadataEndpoint(options.source);
  const size_t host = options.endpoint.find("://") + 3;
  if ((!absl::StartsWith(options.endpoint, "http://") &&
       !absl::StartsWith(options.endpoint, "https://")) ||
      host >= options.endpoint.size() || options.endpoint[host] == ':' ||
      options.endpoint[host] == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metadata_endpoint: expected http://HOST[:PORT], got '", options.endpoint, "'"));
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(on_notice));
  impl->client.set_connection_timeout(std::chrono::seconds(1));
  impl->client.set_read_timeout(std::chrono::seconds(2));
  Impl* i = impl.get();
  impl->thread = std::thread([i] {
    if (i->options.source == PreemptionSource::kAws) {
      i->RunAws();
    } else {
      i->RunGce();
    }
    std::lock_guard<std::mutex> l(i->mu);
    i->done = true;
    i->cv.notify_all();
  });
  return std::unique_ptr<PreemptionWatcher>(new PreemptionWatcher(std::move(impl)));
}

PreemptionWatcher::PreemptionWatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PreemptionWatcher::~PreemptionWatcher() {
  std::unique_lock<std::mutex> l(impl_->mu);
  impl_->stop = true;
  impl_->cv.notify_all();
  // A request in flight (GCE's hanging GET) is cut off; asked again until the thread is out, in
  // case it was between requests the first time.
  while (!impl_->done) {
    impl_->client.stop();
    impl_->cv.wait_for(l, std::chrono::milliseconds(10), [&] { return impl_->done; });
  }
  l.unlock();
  impl_->thread.join();
}

}  // namespace troupe::runtime::internal
