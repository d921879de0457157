// The head's HTTP side (cpp-httplib): the dashboard page and the read-only JSON API it draws
// from, and Prometheus' /metrics. Every answer is the head actor's (ops_view_atom, the same view
// `troupe job` and `troupe status` ask for over the cluster protocol), so there is one source of
// truth and nothing here is locked. With TLS, the same mutual TLS as the rest of the control plane:
// the cluster's CA must have signed the client's certificate (a scraper's, a browser's).
//
//   GET /                      the dashboard (runtime/dashboard/index.html, compiled in)
//   GET /api/cluster           nodes (state, resources used/total, labels, spot), their workers
//                              and the actors they host, placement groups
//   GET /api/jobs              {"jobs": [summary...]}: state, step, loss, tokens/s, world, ...
//   GET /api/jobs/ID           the summary plus series (one per committed step), events (faults,
//                              recoveries, generations, checkpoints), ranks (per rank and step:
//                              start, compute, collective time and bytes) and checkpoints
//   GET /api/jobs/ID/logs      the driver's progress lines (text)
//   GET /metrics               Prometheus text format 0.0.4
#include "internal/ops_http.h"

#include <httplib.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/cluster.h"
#include "troupe/runtime/status.h"

namespace troupe::runtime::internal {

extern const char kDashboardHtml[];  // generated from dashboard/index.html

namespace {

int HttpCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    default:
      return 503;
  }
}

}  // namespace

class OpsHttp::Impl {
 public:
  Impl(caf::actor_system& sys, caf::actor head, std::unique_ptr<httplib::Server> server)
      : sys_(sys), head_(std::move(head)), server_(std::move(server)) {}
  ~Impl() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::StatusOr<int> Start(const std::string& host, int port) {
    server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(kDashboardHtml, "text/html; charset=utf-8");
    });
    Route("/metrics", "metrics", 0, "text/plain; version=0.0.4; charset=utf-8");
    Route("/api/cluster", "cluster", 0, "application/json");
    Route("/api/jobs", "jobs", 0, "application/json");
    Route(R"(/api/jobs/([A-Za-z0-9_.-]+))", "job", 1, "application/json");
    Route(R"(/api/jobs/([A-Za-z0-9_.-]+)/logs)", "logs", 1, "text/plain; charset=utf-8");
    const int bound = port == 0 ? server_->bind_to_any_port(host.c_str())
                                : (server_->bind_to_port(host.c_str(), port) ? port : -1);
    if (bound < 0) {
      return absl::UnavailableError(
          absl::StrCat("--http_port: cannot listen on ", host, ":", port, " for the dashboard"));
    }
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    return bound;
  }

 private:
  // GET `pattern` answers the head's view `what` (of the path's `group`-th capture, if any).
  void Route(const char* pattern, const char* what, int group, const char* type) {
    server_->Get(pattern, [this, what, group, type](const httplib::Request& req,
                                                    httplib::Response& res) {
      const std::string arg = group > 0 ? req.matches[group].str() : "";
      caf::scoped_actor self{sys_};
      absl::Status status = absl::UnavailableError("the head did not answer");
      self->request(head_, std::chrono::seconds(10), ops_view_atom::value, std::string(what), arg)
          .receive(
              [&](std::string& body) {
                status = absl::OkStatus();
                res.set_content(std::move(body), type);
              },
              [&](caf::error& e) { status = ErrorToStatus(e, "head"); });
      res.set_header("Cache-Control", "no-store");
      if (!status.ok()) {
        res.status = HttpCode(status);
        res.set_content(absl::StrCat(status.message(), "\n"), "text/plain");
      }
    });
  }

  caf::actor_system& sys_;
  caf::actor head_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<OpsHttp>> OpsHttp::Start(caf::actor_system& sys, caf::actor head,
                                                        const std::string& host, int port,
                                                        const RuntimeOptions& tls) {
  std::unique_ptr<httplib::Server> server;
  if (tls.tls()) {
    auto ssl = std::make_unique<httplib::SSLServer>(tls.tls_cert.c_str(), tls.tls_key.c_str(),
                                                    tls.tls_ca.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http_port: cannot serve HTTPS with --tls_cert ", tls.tls_cert, ", --tls_key ",
          tls.tls_key, " and --tls_ca ", tls.tls_ca, " (unreadable, or not a matching pair)"));
    }
    server = std::move(ssl);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  auto impl = std::make_unique<Impl>(sys, std::move(head), std::move(server));
  TROUPE_ASSIGN_OR_RETURN(int bound, impl->Start(host, port));
  return std::unique_ptr<OpsHttp>(new OpsHttp(std::move(impl), bound));
}

OpsHttp::OpsHttp(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}
OpsHttp::~OpsHttp() = default;

}  // namespace troupe::runtime::internal
