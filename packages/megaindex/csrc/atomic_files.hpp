// Files written whole under a temporary name and renamed into place, by threads that never take
// the GIL: a cold build of thousands of corpora writes five small cache files for each, and
// creating a file is a system call of tens of microseconds that threads can overlap with the
// build itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// One file of a write: `data` goes to `partial` (created exclusively, never through a link, with
// the umask's permissions), renamed over `path` once complete. With `identities_of` set, the
// file holds `data`, then a JSON object of the identities of earlier files of the same write
// (each entry: a JSON key already quoted, and the index of the file), then `tail`.
struct FileStep {
  std::string path;
  std::string partial;
  std::string data;
  std::vector<std::pair<std::string, size_t>> identities_of;
  std::string tail;
};

// What megafmt.fingerprint.file_identity records of a file, taken on the written file's own
// descriptor after its rename (the rename changes its change time).
struct FileIdentity {
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
};

// A write's outcome: each file's identity, in order, or the errno of the first failure and the
// path it concerns (the files after it are not written; the failed one's partial is removed).
struct WriteOutcome {
  std::vector<FileIdentity> identities;
  int error = 0;
  std::string failed_path;
};

// Write the files one after the other, on the calling thread.
WriteOutcome write_files(const std::vector<FileStep>& steps);

// A write submitted to a pool, finished some time later.
class PendingWrite {
 public:
  explicit PendingWrite(std::vector<FileStep> steps) : steps_(std::move(steps)) {}
  // Block until the write is finished; its outcome.
  const WriteOutcome& wait();
  bool finished();
  void run();

 private:
  std::vector<FileStep> steps_;
  WriteOutcome outcome_;
  bool finished_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
};

// Threads writing submitted writes in the order they came. Destroying the pool finishes what was
// submitted first.
class FileWriterPool {
 public:
  explicit FileWriterPool(size_t threads);
  ~FileWriterPool();
  FileWriterPool(const FileWriterPool&) = delete;
  FileWriterPool& operator=(const FileWriterPool&) = delete;
  std::shared_ptr<PendingWrite> submit(std::vector<FileStep> steps);
  // Finish what was submitted and stop the threads (submitting afterwards is an error).
  void close();

 private:
  void work();
  std::deque<std::shared_ptr<PendingWrite>> queue_;
  std::vector<std::thread> threads_;
  bool closing_ = false;
  std::mutex mutex_;
  std::mutex joining_;  // held by the close that joins the threads
  std::condition_variable queued_;
};
