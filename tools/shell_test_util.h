// shell_test_util.h — the tools' tests run commands as a user would, through the shell.
#ifndef TROUPE_TOOLS_SHELL_TEST_UTIL_H_
#define TROUPE_TOOLS_SHELL_TEST_UTIL_H_

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace troupe::tools {

// Runs `cmd` through the shell; returns its exit status (-1 if it did not exit), with its stdout
// and stderr in *out.
inline int Shell(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  out->clear();
  while (fgets(buf, sizeof buf, p)) *out += buf;
  const int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace troupe::tools

#endif  // TROUPE_TOOLS_SHELL_TEST_UTIL_H_
