// local_etcd.h — a real etcd (Debian's etcd-server) for tests and benchmarks of heads on etcd.
//
//   LocalEtcd etcd(dir);                 // single member on loopback, data in <dir>/etcd
//   if (!etcd.ready()) FAIL() << etcd.log();
//   StartHead(... "--store", etcd.store("/prefix") ...);
//
// Fast elections (10 ms heartbeats, 100 ms election timeout) so that a 1 s leader lease is
// allowed; stopped, and its data removed, when the object goes.
#ifndef TROUPE_RUNTIME_LOCAL_ETCD_H_
#define TROUPE_RUNTIME_LOCAL_ETCD_H_

#include <sys/types.h>

#include <string>

namespace troupe::runtime::testing {

class LocalEtcd {
 public:
  explicit LocalEtcd(const std::string& dir);  // waits up to 20 s for it to be healthy
  ~LocalEtcd();
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  bool ready() const { return ready_; }
  // The head's --store for keys under `prefix`: etcd://127.0.0.1:PORT<prefix>.
  std::string store(const std::string& prefix) const { return "etcd://" + endpoint_ + prefix; }
  std::string log() const;  // etcd's output so far

  // A loopback TCP port free a moment ago.
  static int FreePort();

 private:
  std::string dir_, endpoint_;
  pid_t pid_ = 0;
  bool ready_ = false;
};

}  // namespace troupe::runtime::testing

#endif  // TROUPE_RUNTIME_LOCAL_ETCD_H_
