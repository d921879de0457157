// Test helpers for model/'s file formats: a fresh temporary directory and raw byte edits.
#ifndef TROUPE_MODEL_TEST_FILES_H_
#define TROUPE_MODEL_TEST_FILES_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace troupe::model::testing {

// Removed with everything in it when the test program exits.
inline std::string MakeTempDir() {
  static std::vector<std::string> made;  // NOLINT: lives until exit, as the directories do
  std::string tmpl = "/tmp/troupe_model_test_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return "/nonexistent-mkdtemp-failed";
  if (made.empty()) {
    std::atexit([] {
      std::error_code ec;
      for (const std::string& d : made) std::filesystem::remove_all(d, ec);
    });
  }
  made.push_back(tmpl);
  return tmpl;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace troupe::model::testing

#endif  // TROUPE_MODEL_TEST_FILES_H_
