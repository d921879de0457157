// Test helpers for model/'s file formats: a fresh temporary directory and raw byte edits.
#ifndef TROUPE_MODEL_TEST_FILES_H_
#define TROUPE_MODEL_TEST_FILES_H_

#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <string>

namespace troupe::model::testing {

inline std::string MakeTempDir() {
  std::string tmpl = "/tmp/troupe_model_test_XXXXXX";
  return std::string(::mkdtemp(tmpl.data()));
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
