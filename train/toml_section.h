// toml_section.h — reading one section of a TOML file (toml++) with errors that name the file,
// the field, what was expected and what was there; unknown keys are errors too. Private to
// train/: the job spec (job_spec.cc) and the spot trace (spot_sim.cc).
#ifndef TROUPE_TRAIN_TOML_SECTION_H_
#define TROUPE_TRAIN_TOML_SECTION_H_

#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace troupe::train {

inline const char* TypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    default:
      return "date/time";
  }
}

// Reads the keys of one section, remembering which it knows and the first error.
class Section {
 public:
  Section(const toml::table* t, std::string name, std::string file, absl::Status* err)
      : t_(t), name_(std::move(name)), file_(std::move(file)), err_(err) {}

  void Int(const char* key, int64_t* out, int64_t lo, int64_t hi) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<int64_t> v = n->value_exact<int64_t>();
    if (!v) return Fail(key, "an integer", TypeName(n->type()));
    if (*v < lo || *v > hi) {
      return Fail(key, absl::StrCat("an integer in [", lo, ", ", hi, "]"), absl::StrCat(*v));
    }
    *out = *v;
  }
  template <class T>
  void Int32(const char* key, T* out, int64_t lo, int64_t hi) {
    int64_t v = *out;
    Int(key, &v, lo, hi);
    *out = static_cast<T>(v);
  }
  void Number(const char* key, double* out, double lo, double hi) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<double> v = n->value<double>();  // integers are accepted as numbers
    if (!v || n->is_boolean() || n->is_string()) return Fail(key, "a number", TypeName(n->type()));
    if (*v < lo || *v > hi) {
      return Fail(key, absl::StrCat("a number in [", lo, ", ", hi, "]"), absl::StrCat(*v));
    }
    *out = *v;
  }
  void Float(const char* key, float* out, double lo, double hi) {
    double v = *out;
    Number(key, &v, lo, hi);
    *out = static_cast<float>(v);
  }
  void Str(const char* key, std::string* out, bool nonempty = false) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<std::string> v = n->value_exact<std::string>();
    if (!v) return Fail(key, "a string", TypeName(n->type()));
    if (nonempty && v->empty()) return Fail(key, "a non-empty string", "\"\"");
    *out = *v;
  }
  void Bool(const char* key, bool* out) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<bool> v = n->value_exact<bool>();
    if (!v) return Fail(key, "true or false", TypeName(n->type()));
    *out = *v;
  }
  // A positive (or, with `zero_ok`, non-negative) duration written as a string: "2s", "300ms".
  void Duration(const char* key, absl::Duration* out, bool zero_ok = false) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<std::string> v = n->value_exact<std::string>();
    if (!v) return Fail(key, "a duration string such as \"2s\" or \"300ms\"", TypeName(n->type()));
    absl::Duration d;
    if (!absl::ParseDuration(*v, &d) || d < absl::ZeroDuration() ||
        (d == absl::ZeroDuration() && !zero_ok) || d == absl::InfiniteDuration()) {
      return Fail(key,
                  zero_ok ? "a duration >= 0 such as \"0s\" or \"300ms\""
                          : "a positive duration such as \"2s\" or \"300ms\"",
                  absl::StrCat("\"", *v, "\""));
    }
    *out = d;
  }
  // A non-zero duration that may be negative: "1h", "-30s".
  void SignedDuration(const char* key, absl::Duration* out) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<std::string> v = n->value_exact<std::string>();
    absl::Duration d;
    if (!v || !absl::ParseDuration(*v, &d) || d == absl::ZeroDuration() ||
        d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) {
      return Fail(key, "a non-zero duration such as \"1h\" or \"-30s\"",
                  v ? absl::StrCat("\"", *v, "\"") : TypeName(n->type()));
    }
    *out = d;
  }
  const toml::node* Raw(const char* key) { return Find(key); }
  void Fail(const std::string& key, const std::string& expected, const std::string& got) {
    if (err_->ok()) {
      *err_ = absl::InvalidArgumentError(
          absl::StrCat(file_, ": ", name_, ".", key, ": expected ", expected, ", got ", got));
    }
  }
  // Any key not read above is a mistake (a typo would otherwise be silently ignored).
  void RejectUnknown() {
    if (t_ == nullptr) return;
    for (auto&& [k, v] : *t_) {
      if (!known_.count(std::string(k.str()))) {
        Fail(std::string(k.str()), absl::StrCat("one of ", absl::StrJoin(known_, ", ")),
             "an unknown key");
      }
    }
  }

 private:
  const toml::node* Find(const char* key) {
    known_.insert(key);
    return t_ == nullptr ? nullptr : t_->get(key);
  }
  const toml::table* t_;
  std::string name_, file_;
  absl::Status* err_;
  std::set<std::string> known_;
};

// A whole file, or NotFound "<path>: cannot open <what>".
inline absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open ", what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The document, or InvalidArgument "<file>:<line>:<column>: <what toml++ says>".
inline absl::StatusOr<toml::table> ParseToml(const std::string& text, const std::string& file) {
  toml::parse_result parsed = toml::parse(text, file);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return absl::InvalidArgumentError(absl::StrCat(file, ":", e.source().begin.line, ":",
                                                   e.source().begin.column, ": ",
                                                   std::string(e.description())));
  }
  return std::move(parsed).table();
}

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_TOML_SECTION_H_
