#include "troupe/runtime/processes.h"

#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <string>
#include <thread>

namespace troupe::runtime::testing {

bool AllThreadsStopped(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(tasks.c_str());
  if (d == nullptr) return false;
  bool all = true;
  int seen = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream stat(tasks + "/" + e->d_name + "/stat");
    std::string line;
    std::getline(stat, line);
    // The state follows the command name, which is in parentheses and may hold any character.
    const size_t close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T') {
      all = false;
    }
    ++seen;
  }
  closedir(d);
  return all && seen > 0;
}

bool StopAndWait(pid_t pid, std::chrono::milliseconds within) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!AllThreadsStopped(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace troupe::runtime::testing
