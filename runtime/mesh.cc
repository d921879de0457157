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

struct MeshState {
  Runtime* runtime = nullptr;
  std::string self_id;
  bool follow = false;
  caf::actor head;
  std::map<std::string, caf::actor> connected;  // worker id -> its published worker actor
  std::set<std::string> connecting;
};

// An ordinary (scheduled) actor: the connections are asked of CAF's middleman actor without
// blocking, and no request of it has a deadline (a head gone by now drops a request without a
// word, and CAF 0.17's clock would hold the actor alive past the runtime's shutdown until the
// deadline fired).
caf::behavior MeshActor(caf::stateful_actor<MeshState>* self, Runtime* runtime, std::string self_id,
                        bool follow) {
  self->state.runtime = runtime;
  self->state.self_id = std::move(self_id);
  self->state.follow = follow;
  auto who = [self] {
    return self->state.self_id.empty() ? std::string("mesh")
                                       : absl::StrCat("worker ", self->state.self_id);
  };
  auto reach = [self, who](const MemberInfo& m) {
    MeshState& st = self->state;
    absl::StatusOr<std::pair<std::string, uint16_t>> via =
        DialVia(*st.runtime, m.address, static_cast<uint16_t>(m.port));
    if (!via.ok()) {
      LogWarn(who(),
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
              if (peer) self->state.connected[id] = caf::actor_cast<caf::actor>(peer);
            },
            [self, who, id](caf::error& e) {
              self->state.connecting.erase(id);
              LogWarn(who(), absl::StrCat("no direct connection to worker ", id, ": ",
                                          self->system().render(e),
                                          " (its messages go through the head)"));
            });
  };
  auto reach_all = [self, reach] {
    self->request(self->state.head, caf::infinite, members_atom::value)
        .then([self, reach](const std::vector<MemberInfo>& table) {
          const MeshState& st = self->state;
          for (const MemberInfo& m : table) {
            if (m.kind == MemberKind::kWorker && m.state == MemberState::kAlive && m.port > 0 &&
                m.id != st.self_id && !st.connected.count(m.id) && !st.connecting.count(m.id)) {
              reach(m);
            }
          }
        });
  };
  return {
      [self, reach_all](new_head_atom, const caf::actor& head) {
        self->state.head = head;
        if (self->state.follow) self->send(head, subscribe_atom::value, self);
        reach_all();
      },
      [self, reach_all](membership_atom, const MembershipEvent& e) {
        if (e.kind == MembershipKind::kWorkerAlive) reach_all();
        if (e.kind == MembershipKind::kWorkerDown) self->state.connected.erase(e.subject);
      },
  };
}

}  // namespace

void StartMesh(Runtime& runtime, const caf::actor& head, const std::string& self_id, bool follow) {
  Context& ctx = *runtime.internal_context();
  caf::actor mesh = ctx.mesh();
  if (!mesh) {
    mesh = runtime.system().spawn(MeshActor, &runtime, self_id, follow);
    ctx.Own(mesh);
    ctx.SetMesh(mesh);
  }
  caf::anon_send(mesh, new_head_atom::value, head);
}

}  // namespace troupe::runtime::internal
