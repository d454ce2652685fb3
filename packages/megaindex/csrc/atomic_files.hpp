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
#include <optional>
#include <sys/types.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "corpus_fingerprint.hpp"

// One file of a write: `data` goes to `partial` (created exclusively, never through a link, with
// the umask's permissions), renamed over `path` once complete. With `corpus_idx` set, `data` is
// followed by the fingerprint of that corpus (megaindex::corpus_fingerprint_json of it and
// `corpus_bin`), then `between`; with `identities_of` set, then by a JSON object of the
// identities of earlier files of the same write (each entry: a JSON key already quoted, and the
// index of the file); then `tail`.
struct FileStep {
  std::string path;
  std::string partial;
  std::string data;
  std::string corpus_idx;
  std::string corpus_bin;
  megaindex::SampledBlocks sampling;
  std::vector<uint64_t> corpus_opened;  // the corpus's files as opened (empty: not checked)
  std::string between;
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
// A write that built its tables (TablesJob) has their checksums too, as JSON.
struct WriteOutcome {
  std::vector<FileIdentity> identities;
  int error = 0;
  std::string failed_path;
  std::string checksums;
};

// The error of a write whose tables' walk was refused (the stream ends in an empty document):
// no errno has this value.
constexpr int kTablesRefused = -1;

// GPTDataset's three tables of a small split, built by the write itself (by a writer thread,
// without the GIL) before its files are written: the write's first three files are the
// document, sample and shuffle index (their .npy headers given, the tables' bytes appended),
// and the fourth (the sidecar) holds kChecksumsMark, replaced by the tables' CRC-32s as a JSON
// object keyed as its identities_of. The inputs are megaindex::GptTablesInput's, copied.
struct TablesJob {
  std::vector<int32_t> sizes;
  std::vector<int32_t> documents;
  int32_t num_epochs = 1;
  bool separate_final_epoch = false;
  uint32_t seed = 0;
  int32_t sequence_length = 1;
  int32_t add_extra_token = 1;
  int64_t num_samples = 0;
  int64_t samples_first = 0;
  bool int64_sample_index = false;
  bool int64_shuffle_index = false;
};

// What a TablesJob's sidecar holds where the checksums go (JSON text never holds a NUL).
inline const std::string kChecksumsMark("\0checksums\0", 11);

// Write the files one after the other, on the calling thread (with `job`: its tables built
// first).
WriteOutcome write_files(std::vector<FileStep>& steps, const TablesJob* job = nullptr);

// A write submitted to a pool, finished some time later.
class PendingWrite {
 public:
  explicit PendingWrite(std::vector<FileStep> steps, std::optional<TablesJob> job = std::nullopt)
      : steps_(std::move(steps)), job_(std::move(job)) {}
  // Wait at most `seconds` for the write to finish: its outcome, or nullptr while unfinished
  // (the caller says what it waits for between waits, and takes its signals).
  const WriteOutcome* wait_for(double seconds);
  void run();

 private:
  std::vector<FileStep> steps_;
  std::optional<TablesJob> job_;
  WriteOutcome outcome_;
  bool finished_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
};

// Threads writing submitted writes in the order they came. At most `max_queued_bytes` of files
// wait to be written (more waits in `submit`, one write always passes): a slow file system does
// not pile a blend's tables up in memory. Destroying the pool finishes what was submitted first.
// A pool belongs to the process that made it: in a child forked from it (which has none of its
// threads) submitting is an error and closing leaves the threads alone.
class FileWriterPool {
 public:
  FileWriterPool(size_t threads, size_t max_queued_bytes);
  ~FileWriterPool();
  FileWriterPool(const FileWriterPool&) = delete;
  FileWriterPool& operator=(const FileWriterPool&) = delete;
  // Queue `steps` (with `job`, whose tables count as `job_bytes`) once there is room, waiting at
  // most `seconds` for it: the write, or nullptr (and `steps` left as they were) when there was
  // none.
  std::shared_ptr<PendingWrite> submit(std::vector<FileStep>& steps, double seconds,
                                       std::optional<TablesJob> job = std::nullopt,
                                       size_t job_bytes = 0);
  // Finish what was submitted and stop the threads (submitting afterwards is an error).
  void close();

 private:
  struct Queued {
    std::shared_ptr<PendingWrite> write;
    size_t bytes;
  };
  void work();
  const size_t max_queued_bytes_;
  const pid_t owner_;
  std::deque<Queued> queue_;
  size_t queued_bytes_ = 0;
  // heap-held: a forked child, which has none of these threads, leaves them undestroyed
  std::vector<std::thread>* threads_;
  bool closing_ = false;
  std::mutex mutex_;
  std::mutex joining_;  // held by the close that joins the threads
  std::condition_variable queued_;
  std::condition_variable room_;
};
