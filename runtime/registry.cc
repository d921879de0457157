#include "troupe/runtime/registry.h"

#include <cxxabi.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "caf/type_nr.hpp"

namespace troupe::runtime {

std::string ArgTypeName(uint16_t caf_type_nr, const std::type_info* info) {
  if (caf_type_nr != 0) {
    std::string n = caf::numbered_type_names[caf_type_nr - 1];
    if (n.rfind('@', 0) == 0) n = n.substr(1);
    static const std::map<std::string, std::string> kFriendly = {{"i8", "int8"},
                                                                 {"i16", "int16"},
                                                                 {"i32", "int32"},
                                                                 {"i64", "int64"},
                                                                 {"u8", "uint8"},
                                                                 {"u16", "uint16"},
                                                                 {"u32", "uint32"},
                                                                 {"u64", "uint64"},
                                                                 {"str", "string"},
                                                                 {"strvec", "vector<string>"},
                                                                 {"ldouble", "long double"}};
    auto it = kFriendly.find(n);
    return it == kFriendly.end() ? n : it->second;
  }
  if (info == nullptr) return "?";
  int status = 0;
  char* demangled = abi::__cxa_demangle(info->name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : info->name();
  std::free(demangled);
  return name;
}

std::string DescribeArgs(const caf::message& args) {
  std::vector<std::string> names;
  for (size_t i = 0; i < args.size(); ++i) {
    auto rtti = args.type(i);
    names.push_back(ArgTypeName(rtti.first, rtti.second));
  }
  return absl::StrCat("(", absl::StrJoin(names, ", "), ")");
}

absl::Status ActorRegistry::Add(const std::string& type, Entry e) {
  if (type.empty()) return absl::InvalidArgumentError("actor type name must not be empty");
  if (!entries_.emplace(type, std::move(e)).second) {
    return absl::AlreadyExistsError(absl::StrCat("actor type '", type, "' is already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FunctionActor::Init> ActorRegistry::Bind(const std::string& type,
                                                        const caf::message& args) const {
  auto it = entries_.find(type);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown actor type '", type, "'; registered types: [",
                                            absl::StrJoin(Types(), ", "), "]"));
  }
  if (!it->second.check(args)) {
    return absl::InvalidArgumentError(absl::StrCat("actor type '", type, "' expects arguments ",
                                                   it->second.signature, ", got ",
                                                   DescribeArgs(args)));
  }
  Factory factory = it->second.factory;
  return FunctionActor::Init([factory, args](Actor* self) { return factory(self, args); });
}

std::vector<std::string> ActorRegistry::Types() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

}  // namespace troupe::runtime
