#include "job_harness.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace troupe::testing {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Report ReadReport(const std::string& path) {
  Report r;
  std::istringstream rep(Slurp(path));
  std::string field;
  while (rep >> field) {
    auto eq = field.find('=');
    if (eq == std::string::npos) continue;
    std::string k = field.substr(0, eq), v = field.substr(eq + 1);
    if (k == "recovery_s") r.recovery_s = std::stod(v);
    if (k == "steps_lost") r.steps_lost = std::stoi(v);
    if (k == "steps") r.steps = std::stoi(v);
    if (k == "world") r.world = std::stoi(v);
    if (k == "crc32c") r.crc = v;
    if (k == "generations") r.generations = std::stoi(v);
  }
  return r;
}

std::vector<SupervisionEvent> ReadEvents(const std::string& path) {
  std::vector<SupervisionEvent> out;
  std::istringstream in(Slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    SupervisionEvent e;
    if (runtime::ParseEvent(line, &e)) out.push_back(e);
  }
  return out;
}

std::string FieldOf(const SupervisionEvent& e, const std::string& key) {
  if (key == "child") return e.child;
  if (key == "supervisor") return e.supervisor;
  if (key == "gen") return std::to_string(e.generation);
  if (key == "pid") return std::to_string(e.pid);
  if (key == "signal") return std::to_string(e.signal);
  if (key == "cause") return runtime::ExitCauseName(e.cause);
  return e.Field(key);
}

std::vector<SupervisionEvent> FindEvents(const std::vector<SupervisionEvent>& events,
                                         const std::string& name, const Fields& fields) {
  std::vector<SupervisionEvent> out;
  for (const SupervisionEvent& e : events) {
    bool match = e.event == name;
    for (const auto& [k, v] : fields) match = match && FieldOf(e, k) == v;
    if (match) out.push_back(e);
  }
  return out;
}

std::string ExactlyOnceDefects(const std::string& work_dir, int steps, int microbatches) {
  std::map<std::pair<int64_t, int64_t>, std::multiset<int>> served;  // (step, gen) → k
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(work_dir + "/serve", ec)) {
    std::istringstream in(Slurp(e.path()));
    int64_t s, k, g;
    while (in >> s >> k >> g) served[{s, g}].insert(static_cast<int>(k));
  }
  std::multiset<int> want;
  for (int k = 0; k < microbatches; ++k) want.insert(k);
  std::string defects;
  std::istringstream commits(Slurp(work_dir + "/commits.log"));
  std::map<int64_t, int> committed;
  int64_t s, g;
  while (commits >> s >> g) {
    ++committed[s];
    const std::multiset<int>& got = served[std::make_pair(s, g)];
    if (got != want) {
      absl::StrAppend(&defects, "step ", s, " generation ", g, ": ", got.size(), " of ",
                      microbatches, " microbatches served once for the committed run\n");
    }
  }
  for (int64_t step = 0; step < steps; ++step) {
    if (committed[step] != 1) {
      absl::StrAppend(&defects, "step ", step, " committed ", committed[step], " times\n");
    }
  }
  if (committed.size() != static_cast<size_t>(steps)) {
    absl::StrAppend(&defects, committed.size(), " distinct steps committed, want ", steps, "\n");
  }
  return defects;
}

}  // namespace troupe::testing
