// The head's store on etcd (internal/head_store.h), through etcd's v3 JSON gateway: Debian has
// no C++ etcd client, and one HTTP library (cpp-httplib) serves all of troupe.
//
// Keys under the prefix P: P/epoch (the highest claim), P/leader (the leading head's address,
// under its lease), P/leader_seen (the leader's fenced mark, rewritten each keep-alive),
// P/generation, P/members/<id>, P/actors/<name> and P/jobs/<id> (JSON). Every write is one
// transaction that compares P/epoch with this head's epoch first.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "internal/head_store.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/log.h"

namespace troupe::runtime::internal {
namespace {

using json = nlohmann::json;

std::string B64(const std::string& s) { return absl::Base64Escape(s); }
std::string UnB64(const std::string& s) {
  std::string out;
  absl::Base64Unescape(s, &out);
  return out;
}
// etcd's JSON carries int64s as strings.
int64_t Int(const json& j, const char* key) {
  int64_t v = 0;
  if (!j.contains(key)) return 0;
  if (j[key].is_number()) return j[key].get<int64_t>();
  if (j[key].is_string()) (void)absl::SimpleAtoi(j[key].get<std::string>(), &v);
  return v;
}
// The end of the range of keys that start with `prefix`.
std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

class EtcdHeadStore : public HeadStore {
 public:
  EtcdHeadStore(EtcdStoreOptions o, std::string host, int port)
      : o_(std::move(o)), client_(host, port) {
    client_.set_connection_timeout(std::chrono::seconds(2));
    client_.set_read_timeout(std::chrono::seconds(5));
    client_.set_write_timeout(std::chrono::seconds(5));
  }
  ~EtcdHeadStore() override {
    stop_ = true;
    if (keeper_.joinable()) keeper_.join();
  }

  uint64_t epoch() const override { return epoch_; }

  absl::StatusOr<State> Load() override {
    State s;
    TROUPE_ASSIGN_OR_RETURN(json g, Range(Key("generation")));
    if (g.contains("kvs")) {
      (void)absl::SimpleAtoi(UnB64(g["kvs"][0]["value"].get<std::string>()), &s.generation);
    }
    TROUPE_ASSIGN_OR_RETURN(json members, Range(Key("members/"), /*prefix=*/true));
    for (const json& kv : members.value("kvs", json::array())) {
      const json m = json::parse(UnB64(kv["value"].get<std::string>()), nullptr, false);
      MemberInfo i;
      i.id = m.value("id", "");
      absl::StatusOr<MemberKind> kind = ParseMemberKind(m.value("kind", ""));
      absl::StatusOr<MemberState> state = ParseMemberState(m.value("state", ""));
      if (m.is_discarded() || !kind.ok() || !state.ok()) {
        return absl::DataLossError(absl::StrCat(Where(), ": member '", i.id, "' is unreadable"));
      }
      i.kind = *kind;
      i.state = *state;
      i.node = m.value("node", "");
      i.pid = m.value("pid", int64_t{0});
      i.resources = m.value("resources", "");
      i.labels = m.value("labels", "");
      i.address = m.value("address", "");
      i.host = m.value("host", "");
      s.members.push_back(std::move(i));
    }
    TROUPE_ASSIGN_OR_RETURN(json actors, Range(Key("actors/"), /*prefix=*/true));
    for (const json& kv : actors.value("kvs", json::array())) {
      const json a = json::parse(UnB64(kv["value"].get<std::string>()), nullptr, false);
      if (a.is_discarded()) return absl::DataLossError(absl::StrCat(Where(), ": unreadable actor"));
      s.actors.push_back(
          {a.value("name", ""), a.value("worker", ""), a.value("generation", uint64_t{0})});
    }
    absl::StatusOr<json> jobs = Range(Key("jobs/"), /*prefix=*/true);
    if (!jobs.ok()) return jobs.status();
    const std::string jobs_key = Key("jobs/");
    for (const json& kv : jobs->value("kvs", json::array())) {
      s.jobs.emplace_back(UnB64(kv["key"].get<std::string>()).substr(jobs_key.size()),
                          UnB64(kv["value"].get<std::string>()));
    }
    return s;
  }

  absl::Status PutMembership(uint64_t generation, const std::vector<MemberInfo>& members) override {
    json ops = json::array();
    for (size_t i = 0; i < members.size(); ++i) {
      const MemberInfo& m = members[i];
      const json j = {{"id", m.id},         {"kind", Name(m.kind)},
                      {"node", m.node},     {"state", Name(m.state)},
                      {"pid", m.pid},       {"resources", m.resources},
                      {"labels", m.labels}, {"address", m.address},
                      {"host", m.host}};
      ops.push_back(Put(Key("members/" + m.id), j.dump()));
      if (ops.size() == kEtcdMembersPerTxn && i + 1 < members.size()) {
        TROUPE_RETURN_IF_ERROR(Fenced(ops));
        ops = json::array();
      }
    }
    ops.push_back(Put(Key("generation"), absl::StrCat(generation)));
    return Fenced(ops);
  }
  absl::Status PutJob(const std::string& id, const std::string& record) override {
    return Fenced(Put(Key("jobs/" + id), record));
  }
  absl::Status PutActor(const StoredActor& a) override {
    const json j = {{"name", a.name}, {"worker", a.worker}, {"generation", a.generation}};
    return Fenced(Put(Key("actors/" + a.name), j.dump()));
  }
  absl::Status RemoveActor(const std::string& name) override {
    return Fenced({{"request_delete_range", {{"key", B64(Key("actors/" + name))}}}});
  }

  // Waits until this head leads (no other head's lease holds P/leader), then claims the store
  // and keeps the lease alive; `on_lost` runs once when the leadership is gone.
  absl::Status Lead() {
    const int64_t ttl_s = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::seconds>(o_.leader_ttl).count());
    absl::StatusOr<json> grant = Call("/v3/lease/grant", {{"TTL", ttl_s}});
    if (!grant.ok()) return grant.status();
    lease_ = Int(*grant, "ID");
    bool said = false;
    auto last_keepalive = std::chrono::steady_clock::now();
    while (true) {
      json txn = {{"compare",
                   {{{"target", "CREATE"},
                     {"key", B64(Key("leader"))},
                     {"result", "EQUAL"},
                     {"create_revision", "0"}}}},
                  {"success",
                   {{{"request_put",
                      {{"key", B64(Key("leader"))},
                       {"value", B64(o_.address)},
                       {"lease", absl::StrCat(lease_)}}}}}},
                  {"failure", {{{"request_range", {{"key", B64(Key("leader"))}}}}}}};
      TROUPE_ASSIGN_OR_RETURN(json r, Call("/v3/kv/txn", txn));
      if (r.value("succeeded", false)) break;
      if (!said) {
        std::string leader = "?";
        try {
          leader = UnB64(r["responses"][0]["response_range"]["kvs"][0]["value"]);
        } catch (...) {
        }
        LogInfo("head", absl::StrCat("standby: ", leader, " leads ", Where(),
                                     "; taking over when its lease (", ttl_s, " s) runs out"));
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (std::chrono::steady_clock::now() - last_keepalive > o_.leader_ttl / 3) {
        TROUPE_RETURN_IF_ERROR(KeepAlive());
        last_keepalive = std::chrono::steady_clock::now();
      }
    }
    TROUPE_RETURN_IF_ERROR(Claim());
    keeper_ = std::thread([this] { Keep(); });
    return absl::OkStatus();
  }

 private:
  std::string Key(const std::string& k) const { return absl::StrCat(o_.prefix, "/", k); }
  std::string Where() const { return absl::StrCat("etcd ", o_.endpoint, o_.prefix); }

  absl::StatusOr<json> Call(const std::string& path, const json& body) {
    std::lock_guard<std::mutex> lock(mu_);  // httplib's client: one request at a time
    httplib::Result r = client_.Post(path.c_str(), body.dump(), "application/json");
    if (!r) {
      return absl::UnavailableError(
          absl::StrCat(Where(), ": ", path, ": ", httplib::to_string(r.error())));
    }
    if (r->status != 200) {
      return absl::UnavailableError(
          absl::StrCat(Where(), ": ", path, ": HTTP ", r->status, ": ", r->body));
    }
    json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded()) {
      return absl::DataLossError(absl::StrCat(Where(), ": ", path, ": not JSON: ", r->body));
    }
    return j;
  }
  absl::StatusOr<json> Range(const std::string& key, bool prefix = false) {
    json body = {{"key", B64(key)}};
    if (prefix) body["range_end"] = B64(PrefixEnd(key));
    return Call("/v3/kv/range", body);
  }
  static json Put(const std::string& key, const std::string& value) {
    return {{"request_put", {{"key", B64(key)}, {"value", B64(value)}}}};
  }

  // One claim above every claim before (a compare-and-swap on P/epoch).
  absl::Status Claim() {
    while (true) {
      TROUPE_ASSIGN_OR_RETURN(json r, Range(Key("epoch")));
      uint64_t old = 0;
      json cmp = {{"target", "CREATE"},
                  {"key", B64(Key("epoch"))},
                  {"result", "EQUAL"},
                  {"create_revision", "0"}};
      if (r.contains("kvs")) {
        const json& kv = r["kvs"][0];
        (void)absl::SimpleAtoi(UnB64(kv["value"].get<std::string>()), &old);
        cmp = {{"target", "MOD"},
               {"key", B64(Key("epoch"))},
               {"result", "EQUAL"},
               {"mod_revision", absl::StrCat(Int(kv, "mod_revision"))}};
      }
      absl::StatusOr<json> t =
          Call("/v3/kv/txn",
               {{"compare", {cmp}}, {"success", {Put(Key("epoch"), absl::StrCat(old + 1))}}});
      if (!t.ok()) return t.status();
      if (t->value("succeeded", false)) {
        epoch_ = old + 1;
        return absl::OkStatus();
      }
    }
  }

  // `op` only while P/epoch is still this head's.
  // (`op`: one operation, or an array of them done together.)
  absl::Status Fenced(const json& op) {
    absl::StatusOr<json> t =
        Call("/v3/kv/txn", {{"compare",
                             {{{"target", "VALUE"},
                               {"key", B64(Key("epoch"))},
                               {"result", "EQUAL"},
                               {"value", B64(absl::StrCat(epoch_))}}}},
                            {"success", op.is_array() ? op : json::array({op})},
                            {"failure", {{{"request_range", {{"key", B64(Key("epoch"))}}}}}}});
    if (!t.ok()) return t.status();
    if (t->value("succeeded", false)) return absl::OkStatus();
    std::string now = "?";
    try {
      now = UnB64((*t)["responses"][0]["response_range"]["kvs"][0]["value"]);
    } catch (...) {
    }
    return absl::FailedPreconditionError(
        absl::StrCat(Where(), ": this head's epoch ", epoch_, " was fenced: a head of epoch ", now,
                     " has claimed the store since; its writes are refused"));
  }

  absl::Status KeepAlive() {
    absl::StatusOr<json> k = Call("/v3/lease/keepalive", {{"ID", absl::StrCat(lease_)}});
    if (!k.ok()) return k.status();
    if (Int(k->value("result", json::object()), "TTL") <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(),
                       ": this head's leader lease ran out (its process was stopped, or "
                       "cut off from etcd, for longer than --leader_ttl)"));
    }
    return absl::OkStatus();
  }

  // The leader's duty: a fenced mark, then the lease's keep-alive, a few times per lease length.
  // The first failure of either ends the leadership: a head that was stopped (SIGSTOP) finds its
  // write refused by the epoch its successor claimed meanwhile.
  void Keep() {
    auto deadline = std::chrono::steady_clock::now() + o_.leader_ttl;
    while (!stop_) {
      absl::Status s = Fenced(Put(Key("leader_seen"), o_.address));
      if (s.ok()) s = KeepAlive();
      if (s.ok()) {
        deadline = std::chrono::steady_clock::now() + o_.leader_ttl;
      } else if (s.code() == absl::StatusCode::kFailedPrecondition ||
                 std::chrono::steady_clock::now() > deadline) {
        if (o_.on_lost) o_.on_lost(s);
        return;
      }
      for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(o_.leader_ttl / 30);
    }
  }

  EtcdStoreOptions o_;
  std::mutex mu_;
  httplib::Client client_;
  int64_t lease_ = 0;
  uint64_t epoch_ = 0;
  std::atomic<bool> stop_{false};
  std::thread keeper_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HeadStore>> OpenEtcdHeadStore(EtcdStoreOptions options) {
  absl::string_view rest = options.endpoint;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store: expected etcd://HOST:PORT[/PREFIX] (etcd's client URL), got '",
                     options.endpoint, "'"));
  }
  const size_t colon = rest.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(rest.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store: expected a port in '", options.endpoint, "'"));
  }
  if (options.prefix.empty() || options.prefix[0] != '/') options.prefix = "/" + options.prefix;
  auto store = std::make_unique<EtcdHeadStore>(options, std::string(rest.substr(0, colon)), port);
  TROUPE_RETURN_IF_ERROR(store->Lead());
  return std::unique_ptr<HeadStore>(std::move(store));
}

}  // namespace troupe::runtime::internal
