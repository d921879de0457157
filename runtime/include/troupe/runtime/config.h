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
// Types: int64, double, bool, string, duration ("250ms", "2s", "1m", "500us"), byte sizes
// ("8G", "512M", "4096") and string lists (repeatable flags: `--chaos a --chaos b`, `--input x y`;
// comma-separated in the environment and in Set). Not thread-safe: configure before starting the
// runtime.
//
// A command's main hands its arguments to ParseCommandLine (below): every troupe command —
// head, node, worker, up, certs, train, data — reads its options that one way.
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
[[nodiscard]] absl::StatusOr<Duration> ParseDuration(const std::string& text);
[[nodiscard]] absl::StatusOr<int64_t> ParseByteSize(const std::string& text);
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
  // A list of strings, each item checked by `validate`. As a flag it takes every following
  // argument up to the next "--" one and may be repeated (the items add up; the first flag
  // replaces what the environment set); `--name=item` is one item, commas included. In the
  // environment and in Set the text is a comma-separated list that replaces the value.
  void AddStringList(const std::string& name, std::vector<std::string>* target,
                     const std::string& help, Validator<std::string> validate = nullptr);

  // Sets one option from text; `source` names where the text came from, for the error message.
  [[nodiscard]] absl::Status Set(const std::string& name, const std::string& value,
                                 const std::string& source = "code");

  // Reads TROUPE_<NAME> (upper case, '.' and '-' as '_') for every registered option.
  // `getenv` is injectable for tests.
  [[nodiscard]] absl::Status LoadEnvironment(
      const std::function<const char*(const char*)>& getenv = nullptr);

  // Consumes --name=value / --name value / --flag / --no-flag / --list item... for registered
  // names; everything else (positional arguments, unknown flags) is returned in `rest` in order,
  // so a program can layer its own flags on top. Unknown flags that look like ours ("--troupe.")
  // are an error.
  [[nodiscard]] absl::Status ParseFlags(int argc, const char* const* argv,
                                        std::vector<std::string>* rest);

  // The current value of an option, formatted as text ("" for an unknown name).
  std::string Get(const std::string& name) const;
  // One line per option: name, type, current value, help.
  std::string Help() const;

 private:
  struct Option {
    std::string type;  // "int", "double", "bool", "string", "duration", "bytes", "list"
    std::string help;
    std::function<std::string(const std::string&)> set;  // "" on success, else what's wrong
    std::function<std::string()> get;
    // Lists only: adds one item ("" on success, else what's wrong); empties the list.
    std::function<std::string(const std::string&)> add = nullptr;
    std::function<void()> clear = nullptr;
  };
  void Add(const std::string& name, Option option);
  // Applies `value` to option `name` through `apply` (its set or add), naming name, type,
  // source and value in the error.
  [[nodiscard]] absl::Status Apply(const std::string& name, const Option& option,
                                   const std::function<std::string(const std::string&)>& apply,
                                   const std::string& value, const std::string& source);
  std::map<std::string, Option> options_;
};

// Common validators.
ConfigRegistry::Validator<int64_t> AtLeast(int64_t min);
ConfigRegistry::Validator<int64_t> InRange(int64_t min, int64_t max);
ConfigRegistry::Validator<Duration> Positive();
ConfigRegistry::Validator<std::string> OneOf(std::vector<std::string> allowed);

// The command line of a troupe command: TROUPE_* environment variables, then the flags in
// `args` (the arguments after the command's name), into `config`. "--help" or "-h" prints `usage`
// and every option to stdout. Anything that is not a registered option is an error, printed to
// stderr as "troupe <command>: option 'NAME' (TYPE, from flag --NAME): got 'X': expected ...".
// Returns the exit code when the program should stop (help printed: 0; bad option: 2), or -1 to
// go on:
//
//   if (int rc = ParseCommandLine("train", kUsage, args, config); rc >= 0) return rc;
int ParseCommandLine(const std::string& command, const std::string& usage,
                     const std::vector<std::string>& args, ConfigRegistry& config);

}  // namespace troupe::runtime

#endif  // TROUPE_RUNTIME_CONFIG_H_
