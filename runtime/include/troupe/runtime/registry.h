// troupe/runtime/registry.h — actor types registered by name with typed arguments.
//
// A program that embeds troupe registers every actor type it may spawn, once, before it starts
// the runtime; spawning is then by name with a caf::message of arguments, which is how a spawn
// request crosses processes. The argument types are checked at spawn time and a mismatch is an
// InvalidArgument that names the type and what it expected:
//
//   troupe::runtime::ActorRegistry registry;
//   registry.Register<int32_t, std::string>(
//       "greeter", [](troupe::runtime::Actor* self, int32_t id, std::string greeting) {
//         return caf::behavior{[=](const std::string& who) { return greeting + ", " + who; }};
//       });
//   runtime->Spawn("greeter", caf::make_message(int32_t{1}, std::string("hello")));
#ifndef TROUPE_RUNTIME_REGISTRY_H_
#define TROUPE_RUNTIME_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "caf/actor_system_config.hpp"
#include "caf/behavior.hpp"
#include "caf/message.hpp"
#include "troupe/runtime/actor.h"

namespace troupe::runtime {

// A readable name for an argument type ("int32", "string", or the demangled C++ name).
std::string ArgTypeName(uint16_t caf_type_nr, const std::type_info* info);
// "(int32, string)" for the elements of a message.
std::string DescribeArgs(const caf::message& args);

class ActorRegistry {
 public:
  // Builds an actor's behavior from its arguments (already type-checked).
  using Factory = std::function<caf::behavior(Actor*, const caf::message&)>;

  // Registers `type`, whose factory `f` is called as f(self, Args...). Registering a name twice
  // is an AlreadyExists error.
  template <class... Args, class F>
  [[nodiscard]] absl::Status Register(const std::string& type, F f) {
    std::string expected = "(";
    int i = 0;
    ((expected += (i++ ? ", " : "") + ArgTypeName(caf::type_nr<Args>::value, &typeid(Args))), ...);
    expected += ")";
    auto check = [](const caf::message& m) { return m.match_elements<Args...>(); };
    Factory factory = [f](Actor* self, const caf::message& m) -> caf::behavior {
      return Invoke<Args...>(f, self, m, std::index_sequence_for<Args...>{});
    };
    return Add(type, Entry{expected, check, std::move(factory)});
  }

  // Declares a message type (a struct with an `inspect` overload) under `name` to every actor
  // system a Runtime built from this registry creates, so it can cross processes. Every process
  // of a cluster runs the same registrations (the same program).
  template <class T>
  void AddMessageType(const std::string& name) {
    message_types_.push_back(
        [name](caf::actor_system_config& cfg) { cfg.add_message_type<T>(name); });
  }
  void ApplyMessageTypes(caf::actor_system_config& cfg) const {
    for (const auto& add : message_types_) add(cfg);
  }

  // The factory for `type` bound to `args`, or an error naming what is wrong.
  [[nodiscard]] absl::StatusOr<FunctionActor::Init> Bind(const std::string& type,
                                                         const caf::message& args) const;
  std::vector<std::string> Types() const;

 private:
  struct Entry {
    std::string signature;
    std::function<bool(const caf::message&)> check;
    Factory factory;
  };
  [[nodiscard]] absl::Status Add(const std::string& type, Entry e);

  template <class... Args, class F, size_t... I>
  static caf::behavior Invoke(const F& f, Actor* self, const caf::message& m,
                              std::index_sequence<I...>) {
    return f(self, m.get_as<Args>(I)...);
  }

  std::map<std::string, Entry> entries_;
  std::vector<std::function<void(caf::actor_system_config&)>> message_types_;
};

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_REGISTRY_H_
