// troupe/runtime/config.h — the one typed configuration registry.
//
// Every option troupe reads is declared here once, with a type, a default, a help text and an
// optional validator, and can then be set from code, from command-line flags or from the
// environment. Nothing else in troupe reads the environment. Errors name the option, the source
// and what was expected:
//
//   troupe::runtime::ConfigRegistry reg;
//   int64_t threads = 2;
//   reg.AddInt("threads", &threads, "worker threads of the actor system", AtLeast(1));
//   absl::Status s = reg.LoadEnvironment();             // TROUPE_THREADS=4
//   if (s.ok()) s = reg.ParseFlags(argc, argv, &rest);  // --threads=4 (flags win over env)
//   if (s.ok()) s = reg.Set("threads", "8");            // code wins over both
//
// Types: int64, double, bool, string, duration ("250ms", "2s", "1m", "500us") and byte sizes
// ("8G", "512M", "4096"). Not thread-safe: configure before starting the runtime.
#ifndef TROUPE_RUNTIME_CONFIG_H_
#define TROUPE_RUNTIME_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::runtime {

using Duration = std::chrono::nanoseconds;

// Parsers shared by the registry and by other option parsers (resources, labels).
absl::StatusOr<Duration> ParseDuration(const std::string& text);
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);
std::string FormatDuration(Duration d);

class ConfigRegistry {
 public:
  // A validator returns an error message ("" = valid) for a parsed value.
  template <class T>
  using Validator = std::function<std::string(const T&)>;

  void AddInt(const std::string& name, int64_t* target, const std::string& help,
              Validator<int64_t> validate = nullptr);
  void AddDouble(const std::string& name, double* target, const std::string& help,
                 Validator<double> validate = nullptr);
  void AddBool(const std::string& name, bool* target, const std::string& help);
  void AddString(const std::string& name, std::string* target, const std::string& help,
                 Validator<std::string> validate = nullptr);
  void AddDuration(const std::string& name, Duration* target, const std::string& help,
                   Validator<Duration> validate = nullptr);
  void AddByteSize(const std::string& name, int64_t* target, const std::string& help,
                   Validator<int64_t> validate = nullptr);

  // Sets one option from text; `source` names where the text came from, for the error message.
  absl::Status Set(const std::string& name, const std::string& value,
                   const std::string& source = "code");

  // Reads TROUPE_<NAME> (upper case, '.' and '-' as '_') for every registered option.
  // `getenv` is injectable for tests.
  absl::Status LoadEnvironment(const std::function<const char*(const char*)>& getenv = nullptr);

  // Consumes --name=value / --name value / --flag / --no-flag for registered names; everything
  // else (positional arguments, unknown flags) is returned in `rest` in order, so a program can
  // layer its own flags on top. Unknown flags that look like ours ("--troupe.") are an error.
  absl::Status ParseFlags(int argc, const char* const* argv, std::vector<std::string>* rest);

  bool Has(const std::string& name) const { return options_.count(name) > 0; }
  // The current value of an option, formatted as text ("" for an unknown name).
  std::string Get(const std::string& name) const;
  // One line per option: name, type, current value, help.
  std::string Help() const;

 private:
  struct Option {
    std::string type;  // "int", "double", "bool", "string", "duration", "bytes"
    std::string help;
    std::function<std::string(const std::string&)> set;  // "" on success, else what's wrong
    std::function<std::string()> get;
  };
  void Add(const std::string& name, Option option);
  std::map<std::string, Option> options_;
};

// Common validators.
ConfigRegistry::Validator<int64_t> AtLeast(int64_t min);
ConfigRegistry::Validator<int64_t> InRange(int64_t min, int64_t max);
ConfigRegistry::Validator<Duration> Positive();
ConfigRegistry::Validator<std::string> OneOf(std::vector<std::string> allowed);

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_CONFIG_H_
