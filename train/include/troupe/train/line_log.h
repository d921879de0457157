// line_log.h — an append-only file of lines, each written with one write(2): a kill -9 right
// after loses nothing already written, and concurrent writers never interleave within a line.
// Used by the training actors (serve logs, the job's events.log).
#ifndef TROUPE_TRAIN_LINE_LOG_H_
#define TROUPE_TRAIN_LINE_LOG_H_

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace troupe::train {

class LineLog {
 public:
  explicit LineLog(const std::string& path) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  ~LineLog() {
    if (fd_ >= 0) close(fd_);
  }
  LineLog(const LineLog&) = delete;
  LineLog& operator=(const LineLog&) = delete;

  void Write(const std::string& line) {
    if (fd_ < 0) return;
    const std::string l = line + "\n";
    (void)!write(fd_, l.data(), l.size());
  }

 private:
  int fd_ = -1;
};

}  // namespace troupe::train

#endif  // TROUPE_TRAIN_LINE_LOG_H_
