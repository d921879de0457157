// troupe train: an elastic training job (actors/training.h) on the embedded local cluster, or on a
// running one with --head. Flags override the job spec file's fields.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commands.h"
#include "troupe/actors/training.h"

namespace troupe::tools {
namespace {

constexpr char kUsage[] =
    "usage: troupe train [--spec FILE.toml] [--head HOST:PORT] [--workers N] [--steps N]\n"
    "                    [--work_dir DIR] [--data_dir DIR] [--chaos KIND@STEP[:ARG]]...\n"
    "                    [--report FILE]\n"
    "  --spec     job spec (TOML: [job] [model] [optimizer] [elastic] [checkpoint] [chaos])\n"
    "  --head     submit to a running cluster; without it an embedded cluster is started\n"
    "  --chaos    inject a fault: kill-worker@S[:R], stop-worker@S[:R], kill-shard-and-buddy@S,\n"
    "             sigterm-node@S[:R], join-worker@S, kill-coordinator@S, crash-in-checkpoint@S\n"
    "  --report   write 'recovery_s=<s> steps_lost=<n> crc32c=<hex> steps=<n> world=<n>' when done\n";

bool IntFlag(const std::string& flag, const std::string& v, int64_t lo, int64_t* out) {
  if (!absl::SimpleAtoi(v, out) || *out < lo) {
    std::fprintf(stderr, "troupe train: %s: expected an integer >= %lld, got '%s'\n",
                 flag.c_str(), static_cast<long long>(lo), v.c_str());
    return false;
  }
  return true;
}

}  // namespace

int RunTrain(const Args& args) {
  std::string spec_path, head, report_path, work_dir, data_dir;
  int64_t workers = -1, steps = -1;
  std::vector<std::string> chaos;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (i + 1 >= args.size()) {
      std::fprintf(stderr, "troupe train: %s: expected a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    const std::string& v = args[++i];
    if (a == "--spec") {
      spec_path = v;
    } else if (a == "--head") {
      head = v;
    } else if (a == "--report") {
      report_path = v;
    } else if (a == "--work_dir") {
      work_dir = v;
    } else if (a == "--data_dir") {
      data_dir = v;
    } else if (a == "--chaos") {
      chaos.push_back(v);
    } else if (a == "--workers") {
      if (!IntFlag(a, v, 1, &workers)) return 2;
    } else if (a == "--steps") {
      if (!IntFlag(a, v, 1, &steps)) return 2;
    } else {
      std::fprintf(stderr, "troupe train: unexpected argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  absl::StatusOr<actors::JobSpec> spec =
      spec_path.empty() ? actors::ParseJobSpec("", "(defaults)") : actors::LoadJobSpec(spec_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "troupe train: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  if (workers > 0) {
    spec->workers = static_cast<int32_t>(workers);
    spec->max_workers = std::max(spec->max_workers, spec->workers);
    spec->min_workers = std::min(spec->min_workers, spec->workers);
  }
  if (steps > 0) {
    spec->steps = steps;
    spec->schedule.total_steps = steps;
  }
  if (!work_dir.empty()) spec->work_dir = work_dir;
  if (!data_dir.empty()) spec->model.data_dir = data_dir;
  for (const std::string& c : chaos) {
    absl::StatusOr<actors::Fault> f = actors::ParseFault(c);
    if (!f.ok()) {
      std::fprintf(stderr, "troupe train: --chaos: %s\n", std::string(f.status().message()).c_str());
      return 2;
    }
    spec->faults.push_back(*f);
  }
  // Re-validate the combination (flags may have moved fields out of range).
  absl::StatusOr<actors::JobSpec> checked = actors::ParseJobSpec(spec->ToToml(), "flags + spec");
  if (!checked.ok()) {
    std::fprintf(stderr, "troupe train: %s\n", std::string(checked.status().message()).c_str());
    return 2;
  }
  actors::TrainOptions options;
  options.head = head;
  absl::StatusOr<actors::JobReport> report = actors::RunTrainingJob(*checked, options);
  if (!report.ok()) {
    std::fprintf(stderr, "troupe train: %s\n", report.status().ToString().c_str());
    return 1;
  }
  if (!report_path.empty()) {
    std::ofstream out(report_path);
    out << absl::StrFormat("recovery_s=%.6f steps_lost=%d crc32c=%08x steps=%d world=%d\n",
                           report->recovery_seconds, report->steps_lost,
                           report->final_params_crc32c, report->committed_steps,
                           report->final_world);
  }
  return 0;
}

}  // namespace troupe::tools
