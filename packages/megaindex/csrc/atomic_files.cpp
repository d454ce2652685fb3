#include "atomic_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace {

int64_t nanoseconds(const struct timespec& time) {
  return static_cast<int64_t>(time.tv_sec) * 1000000000 + time.tv_nsec;
}

FileIdentity identity_of(const struct stat& status) {
  FileIdentity identity;
  identity.size = status.st_size;
  identity.mtime_ns = nanoseconds(status.st_mtim);
  identity.ctime_ns = nanoseconds(status.st_ctim);
  identity.inode = status.st_ino;
  identity.device = status.st_dev;
  return identity;
}

// Python's json.dumps of the identities: {"name": [size, mtime, ctime, inode, device], ...}
std::string identities_json(const FileStep& step, const std::vector<FileIdentity>& done) {
  std::string text = "{";
  for (size_t n = 0; n < step.identities_of.size(); ++n) {
    const auto& [key, index] = step.identities_of[n];
    const FileIdentity& identity = done.at(index);
    if (n) text += ", ";
    text += key + ": [" + std::to_string(identity.size) + ", " +
            std::to_string(identity.mtime_ns) + ", " + std::to_string(identity.ctime_ns) + ", " +
            std::to_string(identity.inode) + ", " + std::to_string(identity.device) + "]";
  }
  return text + "}";
}

bool write_all(int descriptor, const char* data, size_t size) {
  while (size) {
    ssize_t written = ::write(descriptor, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

// One file; false (errno set, the partial removed) when it fails.
bool write_one(const FileStep& step, const std::string& bytes, FileIdentity& identity) {
  int descriptor = ::open(step.partial.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (descriptor < 0) return false;
  struct stat status;
  bool written = write_all(descriptor, bytes.data(), bytes.size()) &&
                 ::rename(step.partial.c_str(), step.path.c_str()) == 0 &&
                 ::fstat(descriptor, &status) == 0;
  int failure = errno;
  ::close(descriptor);
  if (!written) {
    ::unlink(step.partial.c_str());  // gone already when the rename succeeded
    errno = failure;
    return false;
  }
  identity = identity_of(status);
  return true;
}

}  // namespace

WriteOutcome write_files(const std::vector<FileStep>& steps) {
  WriteOutcome outcome;
  for (const FileStep& step : steps) {
    FileIdentity identity;
    bool written;
    if (step.identities_of.empty()) {
      written = write_one(step, step.data, identity);
    } else {
      written = write_one(step, step.data + identities_json(step, outcome.identities) + step.tail,
                          identity);
    }
    if (!written) {
      outcome.error = errno;
      outcome.failed_path = step.path;
      return outcome;
    }
    outcome.identities.push_back(identity);
  }
  return outcome;
}

const WriteOutcome& PendingWrite::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return finished_; });
  return outcome_;
}

bool PendingWrite::finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void PendingWrite::run() {
  WriteOutcome outcome = write_files(steps_);
  std::lock_guard<std::mutex> lock(mutex_);
  outcome_ = std::move(outcome);
  steps_.clear();  // the bytes are on disk: free them
  finished_ = true;
  changed_.notify_all();
}

FileWriterPool::FileWriterPool(size_t threads) {
  if (threads == 0) throw std::invalid_argument("a FileWriterPool needs at least one thread");
  for (size_t n = 0; n < threads; ++n) threads_.emplace_back([this] { work(); });
}

FileWriterPool::~FileWriterPool() { close(); }

std::shared_ptr<PendingWrite> FileWriterPool::submit(std::vector<FileStep> steps) {
  auto pending = std::make_shared<PendingWrite>(std::move(steps));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) throw std::logic_error("this FileWriterPool is closed");
    queue_.push_back(pending);
  }
  queued_.notify_one();
  return pending;
}

void FileWriterPool::close() {
  std::lock_guard<std::mutex> joining(joining_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  queued_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

void FileWriterPool::work() {
  for (;;) {
    std::shared_ptr<PendingWrite> pending;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and nothing left
      pending = std::move(queue_.front());
      queue_.pop_front();
    }
    pending->run();
  }
}
