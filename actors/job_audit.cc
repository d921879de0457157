#include "troupe/actors/job_audit.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace troupe::actors {

std::string ExactlyOnceDefects(const std::string& work_dir, int64_t steps, int32_t microbatches,
                               int64_t steps_lost) {
  std::map<std::pair<int64_t, int64_t>, std::multiset<int64_t>> served;  // (step, gen) -> k
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(work_dir + "/serve", ec)) {
    std::ifstream in(e.path());
    int64_t s, k, g;
    while (in >> s >> k >> g) served[{s, g}].insert(k);
  }
  std::multiset<int64_t> want;
  for (int64_t k = 0; k < microbatches; ++k) want.insert(k);
  std::string defects;
  std::ifstream commits(work_dir + "/commits.log");
  if (!commits) absl::StrAppend(&defects, work_dir, "/commits.log: cannot be read\n");
  std::map<int64_t, int> committed;
  int64_t s, g;
  while (commits >> s >> g) {
    ++committed[s];
    const std::multiset<int64_t>& got = served[std::make_pair(s, g)];
    if (got != want) {
      absl::StrAppend(&defects, "step ", s, " generation ", g, ": ", got.size(), " of ",
                      microbatches, " microbatches served once for the committed run\n");
    }
  }
  int64_t again = 0;  // commits of a step after its first: the rolled-back steps re-run
  for (int64_t step = 0; step < steps; ++step) {
    const auto it = committed.find(step);
    if (it == committed.end()) absl::StrAppend(&defects, "step ", step, " never committed\n");
  }
  for (const auto& [step, n] : committed) again += n - 1;
  if (again != steps_lost) {
    std::string which;
    for (const auto& [step, n] : committed) {
      if (n > 1) absl::StrAppend(&which, which.empty() ? "" : ", ", step, " (", n, " times)");
    }
    absl::StrAppend(&defects, again, " steps committed again (", which.empty() ? "none" : which,
                    "), but the job lost ", steps_lost, "\n");
  }
  if (static_cast<int64_t>(committed.size()) != steps) {
    absl::StrAppend(&defects, committed.size(), " distinct steps committed, want ", steps, "\n");
  }
  return defects;
}

}  // namespace troupe::actors
