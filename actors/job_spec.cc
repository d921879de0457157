#include "troupe/actors/job_spec.h"

#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace troupe::actors {
namespace {

const char* TypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    default: return "date/time";
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
  void Float(const char* key, float* out, double lo, double hi) {
    const toml::node* n = Find(key);
    if (n == nullptr) return;
    std::optional<double> v = n->value<double>();  // integers are accepted as numbers
    if (!v || n->is_boolean() || n->is_string()) return Fail(key, "a number", TypeName(n->type()));
    if (*v < lo || *v > hi) {
      return Fail(key, absl::StrCat("a number in [", lo, ", ", hi, "]"), absl::StrCat(*v));
    }
    *out = static_cast<float>(*v);
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

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

namespace {
constexpr std::pair<FaultKind, const char*> kFaultKinds[] = {
    {FaultKind::kKillWorker, "kill-worker"},
    {FaultKind::kStopWorker, "stop-worker"},
    {FaultKind::kKillShardAndBuddy, "kill-shard-and-buddy"},
    {FaultKind::kSigtermNode, "sigterm-node"},
    {FaultKind::kJoinWorker, "join-worker"},
    {FaultKind::kKillCoordinator, "kill-coordinator"},
    {FaultKind::kCrashInCheckpoint, "crash-in-checkpoint"},
};
}  // namespace

const char* FaultKindName(FaultKind kind) {
  for (const auto& [k, name] : kFaultKinds) {
    if (k == kind) return name;
  }
  return "?";
}

std::string Fault::ToString() const {
  const char* k = FaultKindName(kind);
  return arg >= 0 ? absl::StrCat(k, "@", step, ":", arg) : absl::StrCat(k, "@", step);
}

absl::StatusOr<Fault> ParseFault(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '@');
  Fault f;
  bool known = false;
  for (const auto& [k, name] : kFaultKinds) {
    if (parts[0] == name) {
      f.kind = k;
      known = true;
    }
  }
  if (parts.size() != 2 || !known) {
    std::vector<std::string> names;
    for (const auto& [k, name] : kFaultKinds) names.push_back(name);
    return absl::InvalidArgumentError(
        absl::StrCat("fault: expected KIND@STEP[:ARG] with KIND one of ",
                     absl::StrJoin(names, ", "), ", got '", text, "'"));
  }
  std::vector<std::string> sa = absl::StrSplit(parts[1], ':');
  if (sa.size() > 2 || !absl::SimpleAtoi(sa[0], &f.step) || f.step < 0 ||
      (sa.size() == 2 && (!absl::SimpleAtoi(sa[1], &f.arg) || f.arg < 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fault '", text, "': expected STEP (an integer >= 0) and optional :ARG, got '", parts[1],
        "'"));
  }
  return f;
}

std::string JobSpec::CheckpointDir() const {
  return checkpoint_dir.empty() ? work_dir + "/ckpt" : checkpoint_dir;
}

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& toml_text, const std::string& file) {
  toml::parse_result parsed = toml::parse(toml_text, file);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return absl::InvalidArgumentError(absl::StrCat(file, ":", e.source().begin.line, ":",
                                                   e.source().begin.column, ": ",
                                                   std::string(e.description())));
  }
  const toml::table& root = parsed.table();
  JobSpec spec;
  absl::Status err;
  static const std::set<std::string> kSections = {"job", "model", "optimizer", "elastic",
                                                  "checkpoint", "chaos"};
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (!kSections.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": [", key, "]: expected one of [",
                                                     absl::StrJoin(kSections, "], ["),
                                                     "], got an unknown section"));
    }
    if (!v.is_table()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key, ": expected a table, got ", TypeName(v.type())));
    }
  }
  const int64_t kMax = std::numeric_limits<int32_t>::max();
  {
    Section s(root["job"].as_table(), "job", file, &err);
    s.Str("name", &spec.name, true);
    s.Int("steps", &spec.steps, 1, int64_t{1} << 40);
    int64_t seed = static_cast<int64_t>(spec.seed);
    s.Int("seed", &seed, 0, std::numeric_limits<int64_t>::max());
    spec.seed = static_cast<uint64_t>(seed);
    s.Str("work_dir", &spec.work_dir, true);
    s.Bool("deterministic", &spec.deterministic);
    s.RejectUnknown();
  }
  spec.model.seed = spec.seed;
  {
    Section s(root["model"].as_table(), "model", file, &err);
    s.Str("type", &spec.model.type, true);
    s.Str("size", &spec.model.size, true);
    s.Str("data_dir", &spec.model.data_dir);
    s.Int32("seq_len", &spec.model.seq_len, 1, 1 << 20);
    s.Int32("microbatch_size", &spec.model.microbatch_size, 1, 1 << 20);
    s.Int32("microbatches", &spec.model.microbatches, 1, 1 << 16);
    if (const toml::node* o = s.Raw("options")) {
      if (!o->is_table()) {
        s.Fail("options", "a table of strings", TypeName(o->type()));
      } else {
        for (auto&& [k, v] : *o->as_table()) {
          std::optional<std::string> str = v.value_exact<std::string>();
          if (!str) {
            s.Fail(absl::StrCat("options.", std::string(k.str())), "a string", TypeName(v.type()));
            break;
          }
          spec.model.options[std::string(k.str())] = *str;
        }
      }
    }
    s.RejectUnknown();
  }
  bool total_set = false;
  {
    Section s(root["optimizer"].as_table(), "optimizer", file, &err);
    s.Float("lr", &spec.schedule.max_lr, 0, 10);
    s.Float("min_lr", &spec.schedule.min_lr, 0, 10);
    s.Int("warmup_steps", &spec.schedule.warmup_steps, 0, int64_t{1} << 40);
    total_set = s.Raw("total_steps") != nullptr;
    s.Int("total_steps", &spec.schedule.total_steps, 1, int64_t{1} << 40);
    s.Float("weight_decay", &spec.adamw.weight_decay, 0, 10);
    s.Float("max_grad_norm", &spec.adamw.max_grad_norm, 0, 1e9);
    s.Float("beta1", &spec.adamw.beta1, 0, 0.999999);
    s.Float("beta2", &spec.adamw.beta2, 0, 0.999999);
    s.RejectUnknown();
  }
  if (!total_set) spec.schedule.total_steps = spec.steps;
  {
    Section s(root["elastic"].as_table(), "elastic", file, &err);
    s.Int32("workers", &spec.workers, 1, 1024);
    s.Int32("min_workers", &spec.min_workers, 1, 1024);
    s.Int32("max_workers", &spec.max_workers, 1, 1024);
    s.RejectUnknown();
  }
  {
    Section s(root["checkpoint"].as_table(), "checkpoint", file, &err);
    s.Str("dir", &spec.checkpoint_dir);
    s.Int("every", &spec.checkpoint_every, 0, kMax);
    s.Int32("keep_last", &spec.keep_last, 1, 1000);
    s.RejectUnknown();
  }
  {
    Section s(root["chaos"].as_table(), "chaos", file, &err);
    if (const toml::node* f = s.Raw("faults")) {
      if (!f->is_array()) {
        s.Fail("faults", "an array of strings like \"kill-worker@10\"", TypeName(f->type()));
      } else {
        for (const toml::node& e : *f->as_array()) {
          std::optional<std::string> str = e.value_exact<std::string>();
          if (!str) {
            s.Fail("faults", "an array of strings", absl::StrCat("a ", TypeName(e.type())));
            break;
          }
          absl::StatusOr<Fault> fault = ParseFault(*str);
          if (!fault.ok()) {
            s.Fail("faults", "KIND@STEP[:ARG]", absl::StrCat("'", *str, "' (", fault.status().message(), ")"));
            break;
          }
          spec.faults.push_back(*fault);
        }
      }
    }
    s.RejectUnknown();
  }
  if (!err.ok()) return err;
  auto bad = [&](const std::string& field, const std::string& expected, const std::string& got) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", field, ": expected ", expected, ", got ", got));
  };
  if (spec.min_workers > spec.max_workers) {
    return bad("elastic.min_workers", absl::StrCat("at most max_workers (", spec.max_workers, ")"),
               absl::StrCat(spec.min_workers));
  }
  if (spec.workers < spec.min_workers || spec.workers > spec.max_workers) {
    return bad("elastic.workers",
               absl::StrCat("between min_workers and max_workers (", spec.min_workers, "..",
                            spec.max_workers, ")"),
               absl::StrCat(spec.workers));
  }
  if (spec.min_workers > spec.model.microbatches) {
    return bad("elastic.min_workers",
               absl::StrCat("at most model.microbatches (", spec.model.microbatches,
                            "): every worker computes at least one microbatch"),
               absl::StrCat(spec.min_workers));
  }
  if (spec.schedule.min_lr > spec.schedule.max_lr) {
    return bad("optimizer.min_lr", absl::StrCat("at most lr (", spec.schedule.max_lr, ")"),
               absl::StrCat(spec.schedule.min_lr));
  }
  for (const Fault& f : spec.faults) {
    if (f.step >= spec.steps) {
      return bad("chaos.faults", absl::StrCat("a step below job.steps (", spec.steps, ")"),
                 absl::StrCat("'", f.ToString(), "'"));
    }
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the job spec"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseJobSpec(ss.str(), path);
}

std::string JobSpec::ToToml() const {
  std::vector<std::string> faults_q;
  for (const Fault& f : faults) faults_q.push_back(Quote(f.ToString()));
  std::string options;
  for (const auto& [k, v] : model.options) absl::StrAppend(&options, Quote(k), " = ", Quote(v), "\n");
  // Floats are written with enough digits to read back the same float.
  auto num = [](float x) { return absl::StrFormat("%.9g", x); };
  return absl::StrCat(
      "[job]\nname = ", Quote(name), "\nsteps = ", steps, "\nseed = ", seed,
      "\nwork_dir = ", Quote(work_dir), "\ndeterministic = ", deterministic ? "true" : "false",
      "\n\n[model]\ntype = ", Quote(model.type), "\nsize = ", Quote(model.size),
      "\ndata_dir = ", Quote(model.data_dir), "\nseq_len = ", model.seq_len,
      "\nmicrobatch_size = ", model.microbatch_size, "\nmicrobatches = ", model.microbatches,
      "\n\n[model.options]\n", options,
      "\n[optimizer]\nlr = ", num(schedule.max_lr), "\nmin_lr = ", num(schedule.min_lr),
      "\nwarmup_steps = ", schedule.warmup_steps, "\ntotal_steps = ", schedule.total_steps,
      "\nweight_decay = ", num(adamw.weight_decay), "\nmax_grad_norm = ", num(adamw.max_grad_norm),
      "\nbeta1 = ", num(adamw.beta1), "\nbeta2 = ", num(adamw.beta2),
      "\n\n[elastic]\nworkers = ", workers, "\nmin_workers = ", min_workers,
      "\nmax_workers = ", max_workers, "\n\n[checkpoint]\ndir = ", Quote(checkpoint_dir),
      "\nevery = ", checkpoint_every, "\nkeep_last = ", keep_last, "\n\n[chaos]\nfaults = [",
      absl::StrJoin(faults_q, ", "), "]\n");
}

}  // namespace troupe::actors
