#include "internal/mesh.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "internal/cluster_protocol.h"
#include "internal/context.h"
#include "internal/tls.h"
#include "troupe/runtime/log.h"

namespace troupe::runtime::internal {
namespace {

using reach_atom = caf::atom_constant<caf::atom("tr_reach")>;

struct MeshState {
  Runtime* runtime = nullptr;
  std::string self_id;
  caf::actor head;
  std::map<std::string, MemberInfo> table;      // the head's workers, as last asked
  std::map<std::string, caf::actor> connected;  // worker id -> its published worker actor
  std::set<std::string> connecting;
  std::set<std::string> wanted;  // not in the table when asked for: for the next table
  std::set<std::string> asked;   // what the table in flight was asked for
  bool asking = false;           // a members_atom request in flight
};

using MeshSelf = caf::stateful_actor<MeshState>*;

std::string Who(MeshSelf self) {
  return self->state.self_id.empty() ? std::string("mesh")
                                     : absl::StrCat("worker ", self->state.self_id);
}

// No request of the middleman or the head has a deadline: a head gone by now drops a request
// without a word, and CAF 0.17's clock would hold the actor alive past the runtime's shutdown
// until the deadline fired.
void Reach(MeshSelf self, const MemberInfo& m) {
  MeshState& st = self->state;
  absl::StatusOr<std::pair<std::string, uint16_t>> via =
      DialVia(*st.runtime, m.address, static_cast<uint16_t>(m.port));
  if (!via.ok()) {
    LogWarn(Who(self),
            absl::StrCat("no direct connection to worker ", m.id, ": ", via.status().message()));
    return;
  }
  st.connecting.insert(m.id);
  const std::string id = m.id;
  self->request(st.runtime->system().middleman().actor_handle(), caf::infinite,
                caf::connect_atom::value, via->first, via->second)
      .then(
          [self, id](const caf::node_id&, caf::strong_actor_ptr& peer,
                     const std::set<std::string>&) {
            self->state.connecting.erase(id);
            if (!peer) return;
            caf::actor a = caf::actor_cast<caf::actor>(peer);
            self->monitor(a);
            self->state.connected[id] = a;
          },
          [self, id](caf::error& e) {
            self->state.connecting.erase(id);
            LogWarn(Who(self),
                    absl::StrCat("no direct connection to worker ", id, ": ",
                                 self->system().render(e), " (its messages go through the head)"));
          });
}

// Reaches `id` from the table; false when the table does not have it (yet).
bool TryReach(MeshSelf self, const std::string& id) {
  const MeshState& st = self->state;
  if (id == st.self_id || st.connected.count(id) || st.connecting.count(id)) return true;
  auto it = st.table.find(id);
  if (it == st.table.end()) return false;
  const MemberInfo& m = it->second;
  if (m.kind == MemberKind::kWorker && m.state == MemberState::kAlive && m.port > 0) Reach(self, m);
  return true;
}

// The head's table for the wanted workers: one request at a time; a worker wanted while it is in
// flight waits for the next one.
void AskTable(MeshSelf self) {
  MeshState& st = self->state;
  if (st.asking || !st.head || st.wanted.empty()) return;
  st.asking = true;
  st.asked = st.wanted;
  self->request(st.head, caf::infinite, members_atom::value)
      .then(
          [self, head = st.head](const std::vector<MemberInfo>& table) {
            MeshState& st = self->state;
            if (st.head != head) return;  // the lost head's: the new one was asked again
            st.asking = false;
            st.table.clear();
            for (const MemberInfo& m : table) st.table[m.id] = m;
            for (const std::string& id : std::exchange(st.wanted, {})) {
              if (TryReach(self, id)) continue;
              if (!st.asked.count(id)) {
                st.wanted.insert(id);
                continue;
              }
              LogWarn(Who(self), absl::StrCat("no direct connection to worker ", id,
                                              ": the head does not know it"));
            }
            AskTable(self);
          },
          [self, head = st.head](caf::error&) {
            if (self->state.head == head) self->state.asking = false;
          });
}

caf::behavior MeshActor(MeshSelf self, Runtime* runtime, std::string self_id) {
  self->state.runtime = runtime;
  self->state.self_id = std::move(self_id);
  // A dropped connection (its worker gone, or the link) is forgotten: ConnectTo makes it again.
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& c = self->state.connected;
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (it->second.address() == dm.source) {
        c.erase(it);
        return;
      }
    }
  });
  return {
      [self](new_head_atom, const caf::actor& head) {
        MeshState& st = self->state;
        st.head = head;
        // A request to the lost head is never answered: ask the new one for what it was for.
        st.asking = false;
        st.wanted.insert(st.asked.begin(), st.asked.end());
        AskTable(self);
      },
      [self](reach_atom, const std::string& id) {
        if (TryReach(self, id)) return;
        self->state.wanted.insert(id);  // a worker that joined since the table was asked for
        AskTable(self);
      },
  };
}

}  // namespace

void StartMesh(Runtime& runtime, const caf::actor& head, const std::string& self_id) {
  Context& ctx = *runtime.internal_context();
  caf::actor mesh = ctx.mesh();
  if (!mesh) {
    mesh = runtime.system().spawn(MeshActor, &runtime, self_id);
    ctx.Own(mesh);
    ctx.SetMesh(mesh);
  }
  caf::anon_send(mesh, new_head_atom::value, head);
}

void ReachWorker(Context& ctx, const std::string& worker) {
  if (caf::actor mesh = ctx.mesh()) caf::anon_send(mesh, reach_atom::value, worker);
}

}  // namespace troupe::runtime::internal
