#include "atomic_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include "gpt_tables.hpp"

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

// One file; false (errno set, the partial removed) when it fails. The file is closed, and the
// close checked (a network or FUSE file system reports a full disk or quota there), before it
// is renamed into place; its identity is then that of the name, as file_identity takes it,
// when the name still holds this file. Where another process renamed its own over it
// meanwhile, the identity is this file's as written (an inode no longer at the name): a
// reader then checks the file at the name by its checksum instead of taking it for this one.
bool write_one(const FileStep& step, const std::string& bytes, FileIdentity& identity) {
  int descriptor = ::open(step.partial.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (descriptor < 0) return false;
  struct stat own;
  bool written = write_all(descriptor, bytes.data(), bytes.size()) && ::fstat(descriptor, &own) == 0;
  int failure = written ? 0 : errno;
  if (::close(descriptor) != 0 && written) {
    written = false;
    failure = errno;
  }
  struct stat status;
  written = written && ::rename(step.partial.c_str(), step.path.c_str()) == 0 &&
            ::stat(step.path.c_str(), &status) == 0;
  if (!written) {
    if (failure == 0) failure = errno;
    ::unlink(step.partial.c_str());  // gone already when the rename succeeded
    errno = failure;
    return false;
  }
  bool ours = status.st_ino == own.st_ino && status.st_dev == own.st_dev;
  identity = identity_of(ours ? status : own);
  return true;
}

// Room for `count` values of T after `data` (a .npy file's header), where a table is built in
// place: the file's bytes, with no copy of the table (numpy pads its headers to 64 bytes, so
// the values are aligned).
template <typename T>
T* table_after(std::string& data, size_t count) {
  const size_t header = data.size();
  data.resize(header + count * sizeof(T));
  char* table = data.data() + header;
  if (reinterpret_cast<uintptr_t>(table) % alignof(T) != 0) {
    throw std::invalid_argument("a table's .npy header leaves its values unaligned");
  }
  return reinterpret_cast<T*>(table);
}

std::string hex_crc(const std::string& data, size_t header) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data()) + header;
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", megaindex::crc32(0, bytes, data.size() - header));
  return text;
}

// Build `job`'s tables into the first three steps (each a .npy header so far), and put their
// checksums (JSON, keyed as the fourth step's identities_of) in the fourth in place of
// kChecksumsMark and in `checksums`. False when the walk is refused (the stream ends in an
// empty document, or a document id is out of range).
bool build_tables(const TablesJob& job, std::vector<FileStep>& steps, std::string* checksums) {
  if (steps.size() < 4 || steps[3].identities_of.size() != 3) {
    throw std::invalid_argument("a write that builds its tables writes them, then the sidecar");
  }
  const megaindex::GptTablesInput input{
      job.sizes.data(), static_cast<int64_t>(job.sizes.size()),
      job.documents.data(), static_cast<int64_t>(job.documents.size()),
      job.num_epochs, job.separate_final_epoch, job.seed, job.sequence_length,
      job.add_extra_token, job.num_samples, job.samples_first};
  const size_t entries = job.documents.size() * static_cast<size_t>(job.num_epochs);
  const size_t rows = static_cast<size_t>(job.num_samples) + 1;
  const size_t headers[3] = {steps[0].data.size(), steps[1].data.size(), steps[2].data.size()};
  int32_t* document_index = table_after<int32_t>(steps[0].data, entries);
  bool walked = false;
  auto build = [&](auto sample_type, auto shuffle_type) {
    using S = decltype(sample_type);
    using U = decltype(shuffle_type);
    S* samples = table_after<S>(steps[1].data, 2 * rows);
    U* order = table_after<U>(steps[2].data, rows - 1);
    int64_t bad_position = -1;
    auto status = megaindex::build_gpt_tables<S, U>(input, document_index, samples, order,
                                                    &bad_position);
    walked = status == megaindex::SampleIndexStatus::kOk && samples[2 * rows - 1] >= 0;
  };
  if (job.int64_sample_index) {
    job.int64_shuffle_index ? build(int64_t{}, int64_t{}) : build(int64_t{}, uint32_t{});
  } else {
    job.int64_shuffle_index ? build(int32_t{}, int64_t{}) : build(int32_t{}, uint32_t{});
  }
  if (!walked) return false;
  std::string text = "{";
  for (size_t n = 0; n < 3; ++n) {
    if (n) text += ", ";
    text += steps[3].identities_of[n].first + ": \"" + hex_crc(steps[n].data, headers[n]) +
            "\"";
  }
  *checksums = text + "}";
  std::string& sidecar = steps[3].data;
  const size_t mark = sidecar.find(kChecksumsMark);
  if (mark == std::string::npos) {
    throw std::invalid_argument(steps[3].path + ": a sidecar without the checksums' place");
  }
  sidecar.replace(mark, kChecksumsMark.size(), *checksums);
  return true;
}

}  // namespace

WriteOutcome write_files(std::vector<FileStep>& steps, const TablesJob* job) {
  WriteOutcome outcome;
  if (job != nullptr && !build_tables(*job, steps, &outcome.checksums)) {
    outcome.error = kTablesRefused;
    outcome.failed_path = steps[1].path;
    return outcome;
  }
  for (const FileStep& step : steps) {
    FileIdentity identity;
    bool written;
    if (step.corpus_idx.empty() && step.identities_of.empty() && step.tail.empty()) {
      written = write_one(step, step.data, identity);
    } else {
      std::string bytes = step.data;
      if (!step.corpus_idx.empty()) {
        std::string fingerprint;
        if (!megaindex::corpus_fingerprint_json(step.corpus_idx, step.corpus_bin, step.sampling,
                                                step.corpus_opened, &fingerprint,
                                                &outcome.failed_path)) {
          outcome.error = errno;
          return outcome;
        }
        bytes += fingerprint + step.between;
      }
      if (!step.identities_of.empty()) bytes += identities_json(step, outcome.identities);
      written = write_one(step, bytes + step.tail, identity);
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

const WriteOutcome* PendingWrite::wait_for(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, std::chrono::duration<double>(seconds),
                         [this] { return finished_; })) {
    return nullptr;
  }
  return &outcome_;
}

void PendingWrite::run() {
  WriteOutcome outcome;
  try {
    outcome = write_files(steps_, job_ ? &*job_ : nullptr);
  } catch (const std::exception&) {  // out of memory building a file's bytes
    outcome.error = ENOMEM;
    outcome.failed_path = steps_.empty() ? std::string() : steps_.back().path;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  outcome_ = std::move(outcome);
  steps_.clear();  // the bytes are on disk: free them, and the tables' inputs
  job_.reset();
  finished_ = true;
  changed_.notify_all();
}

FileWriterPool::FileWriterPool(size_t threads, size_t max_queued_bytes)
    : max_queued_bytes_(max_queued_bytes), owner_(::getpid()),
      threads_(new std::vector<std::thread>()) {
  if (threads == 0) {
    delete threads_;
    throw std::invalid_argument("a FileWriterPool needs at least one thread");
  }
  try {
    for (size_t n = 0; n < threads; ++n) threads_->emplace_back([this] { work(); });
  } catch (...) {  // a thread that could not start: stop those that did
    close();
    delete threads_;
    throw;
  }
}

FileWriterPool::~FileWriterPool() {
  close();
  if (::getpid() == owner_) delete threads_;
}

std::shared_ptr<PendingWrite> FileWriterPool::submit(std::vector<FileStep>& steps,
                                                     double seconds,
                                                     std::optional<TablesJob> job,
                                                     size_t job_bytes) {
  if (::getpid() != owner_) {
    throw std::logic_error("this FileWriterPool belongs to the process this one was forked from");
  }
  size_t bytes = job_bytes;
  for (const FileStep& step : steps) bytes += step.data.size();
  std::shared_ptr<PendingWrite> pending;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    bool room = room_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
      return closing_ || queue_.empty() || queued_bytes_ + bytes <= max_queued_bytes_;
    });
    if (closing_) throw std::logic_error("this FileWriterPool is closed");
    if (!room) return nullptr;
    pending = std::make_shared<PendingWrite>(std::move(steps), std::move(job));
    queue_.push_back({pending, bytes});
    queued_bytes_ += bytes;
  }
  queued_.notify_one();
  return pending;
}

void FileWriterPool::close() {
  if (::getpid() != owner_) return;  // a forked child: none of the threads are its own
  std::lock_guard<std::mutex> joining(joining_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  queued_.notify_all();
  room_.notify_all();
  for (std::thread& thread : *threads_) thread.join();
  threads_->clear();
}

void FileWriterPool::work() {
  for (;;) {
    Queued next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, and nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next.write->run();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued_bytes_ -= next.bytes;
    }
    room_.notify_all();
  }
}
