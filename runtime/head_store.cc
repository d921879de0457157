#include "internal/head_store.h"

#include <sqlite3.h>

#include <functional>

#include "absl/strings/str_cat.h"
#include "troupe/base/status_macros.h"

namespace troupe::runtime::internal {
namespace {

constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS troupe_meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS troupe_members(id TEXT PRIMARY KEY, kind TEXT NOT NULL,
  node TEXT NOT NULL, state TEXT NOT NULL, pid INTEGER NOT NULL, resources TEXT NOT NULL,
  labels TEXT NOT NULL, address TEXT NOT NULL, host TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS troupe_actors(name TEXT PRIMARY KEY, worker TEXT NOT NULL,
  generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS troupe_jobs(id TEXT PRIMARY KEY, record TEXT NOT NULL);
)";

// One prepared statement, finalized on every path.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Statement() { sqlite3_finalize(s_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  Statement& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  void Reset() { sqlite3_reset(s_); }  // to step again with new bindings
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t == nullptr ? "" : reinterpret_cast<const char*>(t);
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

class SqliteHeadStore : public HeadStore {
 public:
  SqliteHeadStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteHeadStore() override { sqlite3_close(db_); }

  uint64_t epoch() const override { return epoch_; }

  absl::Status Claim() {
    return InTransaction(/*fenced=*/false, [&]() -> absl::Status {
      Statement read(db_, "SELECT value FROM troupe_meta WHERE key = 'epoch'");
      if (!read.ok()) return Error("reading the epoch");
      epoch_ = read.Step() == SQLITE_ROW ? static_cast<uint64_t>(read.Int(0)) + 1 : 1;
      return Exec(absl::StrCat("INSERT OR REPLACE INTO troupe_meta VALUES ('epoch', ", epoch_, ")"),
                  "claiming the store");
    });
  }

  absl::StatusOr<State> Load() override {
    State s;
    {
      Statement g(db_, "SELECT value FROM troupe_meta WHERE key = 'generation'");
      if (!g.ok()) return Error("reading the generation");
      if (g.Step() == SQLITE_ROW) s.generation = static_cast<uint64_t>(g.Int(0));
    }
    Statement m(db_,
                "SELECT id, kind, node, state, pid, resources, labels, address, host FROM "
                "troupe_members ORDER BY id");
    if (!m.ok()) return Error("reading the members");
    while (m.Step() == SQLITE_ROW) {
      MemberInfo i;
      i.id = m.Text(0);
      absl::StatusOr<MemberKind> kind = ParseMemberKind(m.Text(1));
      absl::StatusOr<MemberState> state = ParseMemberState(m.Text(3));
      if (!kind.ok() || !state.ok()) {
        return absl::DataLossError(
            absl::StrCat(path_, ": member '", i.id,
                         "': ", (kind.ok() ? state.status() : kind.status()).message()));
      }
      i.kind = *kind;
      i.node = m.Text(2);
      i.state = *state;
      i.pid = m.Int(4);
      i.resources = m.Text(5);
      i.labels = m.Text(6);
      i.address = m.Text(7);
      i.host = m.Text(8);
      s.members.push_back(std::move(i));
    }
    Statement a(db_, "SELECT name, worker, generation FROM troupe_actors ORDER BY name");
    if (!a.ok()) return Error("reading the actors");
    while (a.Step() == SQLITE_ROW) {
      s.actors.push_back({a.Text(0), a.Text(1), static_cast<uint64_t>(a.Int(2))});
    }
    Statement j(db_, "SELECT id, record FROM troupe_jobs ORDER BY id");
    if (!j.ok()) return Error("reading the jobs");
    while (j.Step() == SQLITE_ROW) s.jobs.emplace_back(j.Text(0), j.Text(1));
    return s;
  }

  absl::Status PutMembership(uint64_t generation, const std::vector<MemberInfo>& members) override {
    return InTransaction(true, [&]() -> absl::Status {
      TROUPE_RETURN_IF_ERROR(
          Exec(absl::StrCat("INSERT OR REPLACE INTO troupe_meta VALUES ('generation', ", generation,
                            ")"),
               "writing the generation"));
      Statement s(db_, "INSERT OR REPLACE INTO troupe_members VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
      if (!s.ok()) return Error("writing a member");
      for (const MemberInfo& m : members) {
        s.Reset();
        s.Bind(1, m.id).Bind(2, std::string(Name(m.kind))).Bind(3, m.node);
        s.Bind(4, std::string(Name(m.state))).Bind(5, m.pid).Bind(6, m.resources);
        s.Bind(7, m.labels).Bind(8, m.address).Bind(9, m.host);
        if (s.Step() != SQLITE_DONE) return Error("writing member " + m.id);
      }
      return absl::OkStatus();
    });
  }

  absl::Status PutActor(const StoredActor& a) override {
    return InTransaction(true, [&]() -> absl::Status {
      Statement s(db_, "INSERT OR REPLACE INTO troupe_actors VALUES (?, ?, ?)");
      if (!s.ok()) return Error("writing an actor");
      s.Bind(1, a.name).Bind(2, a.worker).Bind(3, static_cast<int64_t>(a.generation));
      return s.Step() == SQLITE_DONE ? absl::OkStatus() : Error("writing actor " + a.name);
    });
  }

  absl::Status RemoveActor(const std::string& name) override {
    return InTransaction(true, [&]() -> absl::Status {
      Statement s(db_, "DELETE FROM troupe_actors WHERE name = ?");
      if (!s.ok()) return Error("removing an actor");
      s.Bind(1, name);
      return s.Step() == SQLITE_DONE ? absl::OkStatus() : Error("removing actor " + name);
    });
  }

  absl::Status PutJob(const std::string& id, const std::string& record) override {
    return InTransaction(true, [&]() -> absl::Status {
      Statement s(db_, "INSERT OR REPLACE INTO troupe_jobs VALUES (?, ?)");
      if (!s.ok()) return Error("writing a job");
      s.Bind(1, id).Bind(2, record);
      return s.Step() == SQLITE_DONE ? absl::OkStatus() : Error("writing job " + id);
    });
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InternalError(absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_)));
  }
  absl::Status Exec(const std::string& sql, const std::string& what) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) == SQLITE_OK) return {};
    const std::string m = err != nullptr ? err : "?";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat(path_, ": ", what, ": ", m));
  }
  // `body` inside BEGIN IMMEDIATE (the write lock first) ... COMMIT; with `fenced`, only while
  // the store's epoch is still this head's.
  absl::Status InTransaction(bool fenced, const std::function<absl::Status()>& body) {
    TROUPE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", "locking the store"));
    absl::Status s;
    if (fenced) {
      Statement read(db_, "SELECT value FROM troupe_meta WHERE key = 'epoch'");
      const uint64_t now = read.ok() && read.Step() == SQLITE_ROW ? read.Int(0) : 0;
      if (now != epoch_) {
        s = absl::FailedPreconditionError(
            absl::StrCat(path_, ": this head's epoch ", epoch_, " was fenced: a head of epoch ",
                         now, " has claimed the store since; its writes are refused"));
      }
    }
    if (s.ok()) s = body();
    if (!s.ok()) {
      (void)Exec("ROLLBACK", "rolling back");
      return s;
    }
    return Exec("COMMIT", "committing");
  }

  sqlite3* db_;
  std::string path_;
  uint64_t epoch_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HeadStore>> OpenSqliteHeadStore(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    const std::string m = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat(path, ": cannot open the head's store: ", m));
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteHeadStore>(db, path);
  char* err = nullptr;
  // Durable at each commit; a file that is not a troupe head store fails here, naming it.
  if (sqlite3_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;", nullptr, nullptr,
                   &err) != SQLITE_OK ||
      sqlite3_exec(db, kSchema, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string m = err != nullptr ? err : "?";
    sqlite3_free(err);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a troupe head store (", m, ")"));
  }
  TROUPE_RETURN_IF_ERROR(store->Claim());
  return std::unique_ptr<HeadStore>(std::move(store));
}

}  // namespace troupe::runtime::internal
