#include "troupe/runtime/config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "troupe/base/status_macros.h"
#include "troupe/runtime/log.h"

namespace troupe::runtime {
namespace {

template <class T>
std::function<std::string(const std::string&)> MakeSetter(
    T* target, const std::function<absl::StatusOr<T>(const std::string&)>& parse,
    const ConfigRegistry::Validator<T>& validate) {
  return [=](const std::string& text) -> std::string {
    absl::StatusOr<T> v = parse(text);
    if (!v.ok()) return std::string(v.status().message());
    if (validate) {
      std::string why = validate(*v);
      if (!why.empty()) return why;
    }
    *target = *v;
    return "";
  };
}

absl::StatusOr<int64_t> ParseInt(const std::string& text) {
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) return absl::InvalidArgumentError("expected an integer");
  return v;
}

absl::StatusOr<double> ParseDouble(const std::string& text) {
  double v;
  if (!absl::SimpleAtod(text, &v)) return absl::InvalidArgumentError("expected a number");
  return v;
}

absl::StatusOr<bool> ParseBool(const std::string& text) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return absl::InvalidArgumentError("expected true/false (or 1/0, yes/no, on/off)");
}

absl::StatusOr<std::string> ParseString(const std::string& text) { return text; }

std::string EnvName(const std::string& name) {
  std::string env = "TROUPE_";
  for (char c : name) env += (c == '.' || c == '-') ? '_' : absl::ascii_toupper(c);
  return env;
}

}  // namespace

absl::StatusOr<Duration> ParseDuration(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  double value;
  if (i == 0 || !absl::SimpleAtod(text.substr(0, i), &value)) {
    return absl::InvalidArgumentError("expected a duration such as 250ms, 2s, 1m");
  }
  std::string unit = text.substr(i);
  double ns_per_unit;
  if (unit == "ns")
    ns_per_unit = 1;
  else if (unit == "us")
    ns_per_unit = 1e3;
  else if (unit == "ms")
    ns_per_unit = 1e6;
  else if (unit == "s")
    ns_per_unit = 1e9;
  else if (unit == "m")
    ns_per_unit = 60e9;
  else if (unit == "h")
    ns_per_unit = 3600e9;
  else
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a duration unit ns, us, ms, s, m or h after the number, got '", unit, "'"));
  return Duration(static_cast<int64_t>(value * ns_per_unit));
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  if (text.empty()) return absl::InvalidArgumentError("expected a size such as 512M or 8G");
  int64_t scale = 1;
  std::string digits = text;
  char last = absl::ascii_toupper(text.back());
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    scale = last == 'K'   ? (1LL << 10)
            : last == 'M' ? (1LL << 20)
            : last == 'G' ? (1LL << 30)
                          : (1LL << 40);
    digits = text.substr(0, text.size() - 1);
  }
  int64_t v;
  if (!absl::SimpleAtoi(digits, &v) || v < 0) {
    return absl::InvalidArgumentError("expected a size such as 4096, 512M or 8G");
  }
  return v * scale;
}

std::string FormatDuration(Duration d) {
  int64_t ns = d.count();
  if (ns % 1000000000 == 0) return absl::StrCat(ns / 1000000000, "s");
  if (ns % 1000000 == 0) return absl::StrCat(ns / 1000000, "ms");
  if (ns % 1000 == 0) return absl::StrCat(ns / 1000, "us");
  return absl::StrCat(ns, "ns");
}

void ConfigRegistry::Add(const std::string& name, Option option) {
  options_[name] = std::move(option);
}

void ConfigRegistry::AddInt(const std::string& name, int64_t* target, const std::string& help,
                            Validator<int64_t> validate) {
  Add(name, {"int", help, MakeSetter<int64_t>(target, ParseInt, validate),
             [target] { return absl::StrCat(*target); }});
}

void ConfigRegistry::AddDouble(const std::string& name, double* target, const std::string& help,
                               Validator<double> validate) {
  Add(name, {"double", help, MakeSetter<double>(target, ParseDouble, validate),
             [target] { return absl::StrCat(*target); }});
}

void ConfigRegistry::AddBool(const std::string& name, bool* target, const std::string& help) {
  Add(name, {"bool", help, MakeSetter<bool>(target, ParseBool, nullptr),
             [target] { return std::string(*target ? "true" : "false"); }});
}

void ConfigRegistry::AddString(const std::string& name, std::string* target,
                               const std::string& help, Validator<std::string> validate) {
  Add(name, {"string", help, MakeSetter<std::string>(target, ParseString, validate),
             [target] { return *target; }});
}

void ConfigRegistry::AddDuration(const std::string& name, Duration* target, const std::string& help,
                                 Validator<Duration> validate) {
  Add(name, {"duration", help, MakeSetter<Duration>(target, ParseDuration, validate),
             [target] { return FormatDuration(*target); }});
}

void ConfigRegistry::AddByteSize(const std::string& name, int64_t* target, const std::string& help,
                                 Validator<int64_t> validate) {
  Add(name, {"bytes", help, MakeSetter<int64_t>(target, ParseByteSize, validate),
             [target] { return absl::StrCat(*target); }});
}

void ConfigRegistry::AddStringList(const std::string& name, std::vector<std::string>* target,
                                   const std::string& help, Validator<std::string> validate) {
  auto check = [validate](const std::string& item) {
    if (item.empty()) return std::string("expected a non-empty item");
    return validate ? validate(item) : std::string();
  };
  Option o;
  o.type = "list";
  o.help = help;
  o.set = [target, check](const std::string& text) {
    std::vector<std::string> items = absl::StrSplit(text, ',', absl::SkipEmpty());
    for (const std::string& item : items) {
      std::string why = check(item);
      if (!why.empty()) return absl::StrCat("item '", item, "': ", why);
    }
    *target = std::move(items);
    return std::string();
  };
  o.get = [target] { return absl::StrJoin(*target, ","); };
  o.add = [target, check](const std::string& item) {
    std::string why = check(item);
    if (why.empty()) target->push_back(item);
    return why;
  };
  o.clear = [target] { target->clear(); };
  Add(name, std::move(o));
}

absl::Status ConfigRegistry::Apply(const std::string& name, const Option& option,
                                   const std::function<std::string(const std::string&)>& apply,
                                   const std::string& value, const std::string& source) {
  std::string why = apply(value);
  if (!why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("option '", name, "' (", option.type, ", from ",
                                                   source, "): got '", value, "': ", why));
  }
  return absl::OkStatus();
}

absl::Status ConfigRegistry::Set(const std::string& name, const std::string& value,
                                 const std::string& source) {
  auto it = options_.find(name);
  if (it == options_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, o] : options_) names.push_back(n);
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option '", name, "' (from ", source,
                     "); known options: ", absl::StrJoin(names, ", ")));
  }
  return Apply(name, it->second, it->second.set, value, source);
}

absl::Status ConfigRegistry::LoadEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  for (const auto& [name, option] : options_) {
    std::string env = EnvName(name);
    const char* value = getenv ? getenv(env.c_str()) : std::getenv(env.c_str());
    if (value == nullptr) continue;
    TROUPE_RETURN_IF_ERROR(Set(name, value, absl::StrCat("environment variable ", env)));
  }
  return absl::OkStatus();
}

absl::Status ConfigRegistry::ParseFlags(int argc, const char* const* argv,
                                        std::vector<std::string>* rest) {
  std::set<std::string> lists_seen;  // the first flag of a list replaces the environment's items
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (rest) rest->push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::string name = body, value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    if (body.rfind("troupe.", 0) == 0) name = name.substr(7);
    auto it = options_.find(name);
    if (it == options_.end() && !has_value && name.rfind("no-", 0) == 0 &&
        options_.count(name.substr(3)) && options_.at(name.substr(3)).type == "bool") {
      name = name.substr(3);
      value = "false";
      has_value = true;
      it = options_.find(name);
    }
    if (it == options_.end()) {
      if (body.rfind("troupe.", 0) == 0) return Set(name, value, "flag " + arg);
      if (rest) rest->push_back(arg);
      continue;
    }
    const Option& option = it->second;
    if (option.add) {
      if (lists_seen.insert(name).second) option.clear();
      std::vector<std::string> items;
      if (has_value) items.push_back(value);
      while (!has_value && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        items.push_back(argv[++i]);
      }
      if (items.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("option '", name, "' (list, from flag ", arg,
                                                       "): expected a value after it"));
      }
      for (const std::string& item : items) {
        TROUPE_RETURN_IF_ERROR(Apply(name, option, option.add, item, "flag --" + name));
      }
      continue;
    }
    if (!has_value) {
      if (it->second.type == "bool") {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("option '", name, "' (", it->second.type,
                                                       ", from flag ", arg,
                                                       "): expected a value after it"));
      }
    }
    TROUPE_RETURN_IF_ERROR(Set(name, value, "flag --" + name));
  }
  return absl::OkStatus();
}

std::string ConfigRegistry::Get(const std::string& name) const {
  auto it = options_.find(name);
  return it == options_.end() ? "" : it->second.get();
}

std::string ConfigRegistry::Help() const {
  std::ostringstream out;
  for (const auto& [name, option] : options_) {
    out << "  --" << name << "=<" << option.type << ">  " << option.help
        << " (default: " << option.get() << "; env " << EnvName(name) << ")\n";
  }
  return out.str();
}

ConfigRegistry::Validator<int64_t> AtLeast(int64_t min) {
  return [min](const int64_t& v) {
    return v >= min ? std::string() : absl::StrCat("expected at least ", min);
  };
}

ConfigRegistry::Validator<int64_t> InRange(int64_t min, int64_t max) {
  return [min, max](const int64_t& v) {
    return v >= min && v <= max ? std::string()
                                : absl::StrCat("expected a value in [", min, ", ", max, "]");
  };
}

ConfigRegistry::Validator<Duration> Positive() {
  return [](const Duration& v) {
    return v.count() > 0 ? std::string() : std::string("expected a positive duration");
  };
}

ConfigRegistry::Validator<std::string> OneOf(std::vector<std::string> allowed) {
  return [allowed](const std::string& v) {
    for (const auto& a : allowed)
      if (a == v) return std::string();
    return absl::StrCat("expected one of ", absl::StrJoin(allowed, ", "));
  };
}

int ParseCommandLine(const std::string& command, const std::string& usage,
                     const std::vector<std::string>& args, ConfigRegistry& config) {
  std::vector<const char*> argv = {command.c_str()};
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << usage << "\n\nOptions (also as TROUPE_<NAME> environment variables):\n"
                << config.Help();
      return 0;
    }
    argv.push_back(a.c_str());
  }
  absl::Status s = config.LoadEnvironment();
  std::vector<std::string> rest;
  if (s.ok()) s = config.ParseFlags(static_cast<int>(argv.size()), argv.data(), &rest);
  if (s.ok() && !rest.empty()) {
    s = absl::InvalidArgumentError(absl::StrCat("unexpected argument '", rest[0], "'"));
  }
  if (!s.ok()) {
    LogError(command, absl::StrCat(s.message(), " (see --help)"));
    return 2;
  }
  return -1;
}

}  // namespace troupe::runtime
