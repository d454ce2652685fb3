#include "corpus_fingerprint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace megaindex {

namespace {

// Tables of the reflected polynomial 0xedb88320, eight at a time (slicing by 8).
struct CrcTables {
  uint32_t table[8][256];
  CrcTables() {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      uint32_t value = byte;
      for (int bit = 0; bit < 8; ++bit) value = (value >> 1) ^ ((value & 1U) ? 0xedb88320U : 0U);
      table[0][byte] = value;
    }
    for (uint32_t byte = 0; byte < 256; ++byte) {
      for (int slice = 1; slice < 8; ++slice) {
        const uint32_t previous = table[slice - 1][byte];
        table[slice][byte] = (previous >> 8) ^ table[0][previous & 0xffU];
      }
    }
  }
};

const CrcTables& crc_tables() {
  static const CrcTables tables;
  return tables;
}

constexpr uint64_t kInitial[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL,
                                  0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
                                  0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                  0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

constexpr uint8_t kSigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

inline uint64_t rotate_right(uint64_t value, int bits) {
  return (value >> bits) | (value << (64 - bits));
}

inline uint64_t little_endian64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int n = 7; n >= 0; --n) value = (value << 8) | bytes[n];
  return value;
}

inline void mix(uint64_t* v, int a, int b, int c, int d, uint64_t x, uint64_t y) {
  v[a] = v[a] + v[b] + x;
  v[d] = rotate_right(v[d] ^ v[a], 32);
  v[c] = v[c] + v[d];
  v[b] = rotate_right(v[b] ^ v[c], 24);
  v[a] = v[a] + v[b] + y;
  v[d] = rotate_right(v[d] ^ v[a], 16);
  v[c] = v[c] + v[d];
  v[b] = rotate_right(v[b] ^ v[c], 63);
}

// A descriptor closed when it goes out of scope.
struct Descriptor {
  int value;
  explicit Descriptor(const std::string& path)
      : value(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~Descriptor() {
    if (value >= 0) ::close(value);
  }
};

// Up to `size` bytes at `offset` (fewer at the end of the file), as os.pread reads them.
bool read_at(int descriptor, int64_t offset, int64_t size, std::vector<unsigned char>* out) {
  out->resize(static_cast<size_t>(std::max<int64_t>(size, 0)));
  ssize_t got;
  do {
    got = ::pread(descriptor, out->data(), out->size(), offset);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return false;
  out->resize(static_cast<size_t>(got));
  return true;
}

// Whether the file of `status` is the one recorded as opened (`opened`: its size and inode;
// nullptr: no record) and, with `modified`, not written since (its modification time in ns);
// errno is ESTALE where it is not.
bool as_opened(const struct stat& status, const uint64_t* opened,
               const uint64_t* modified = nullptr) {
  if (opened == nullptr) return true;
  // Python's st_mtime_ns as an unsigned 64-bit value (wrapping, as `& UINT64` does there)
  const uint64_t mtime_ns = static_cast<uint64_t>(status.st_mtim.tv_sec) * 1000000000u +
                            static_cast<uint64_t>(status.st_mtim.tv_nsec);
  if (static_cast<uint64_t>(status.st_size) == opened[0] &&
      static_cast<uint64_t>(status.st_ino) == opened[1] &&
      (modified == nullptr || mtime_ns == *modified)) {
    return true;
  }
  errno = ESTALE;
  return false;
}

// megafmt.fingerprint.file_checksum: every byte to the end of the file. With `opened`, the file
// must be the one opened before the read and after it (a write in place meanwhile changes its
// modification time): a checksum of bytes written under the read would describe neither.
bool idx_checksum(const std::string& path, const uint64_t* opened, const uint64_t* modified,
                  int64_t* size, uint32_t* crc) {
  Descriptor file(path);
  if (file.value < 0) return false;
  struct stat status;
  if (::fstat(file.value, &status) != 0 || !as_opened(status, opened, modified)) return false;
  // no larger than the file (a blend's .idx files are small), at most 1 MiB
  std::vector<unsigned char> buffer(
      static_cast<size_t>(std::min<int64_t>(status.st_size + 1, int64_t{1} << 20)));
  *size = 0;
  *crc = 0;
  for (;;) {
    const ssize_t got = ::read(file.value, buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (got == 0) break;
    *crc = crc32(*crc, buffer.data(), static_cast<size_t>(got));
    *size += got;
  }
  return ::fstat(file.value, &status) == 0 && as_opened(status, opened, modified);
}

// megafmt.fingerprint._sampled_hash.
bool bin_hash(const std::string& path, const SampledBlocks& sampling, const uint64_t* opened,
              int64_t* size, std::string* digest) {
  Descriptor file(path);
  if (file.value < 0) return false;
  struct stat status;
  if (::fstat(file.value, &status) != 0 || !as_opened(status, opened)) return false;
  *size = status.st_size;
  Blake2b hash(16);
  std::vector<unsigned char> block;
  const int64_t step = std::max(*size / sampling.blocks, sampling.block_bytes);
  if (step == sampling.block_bytes) {  // the blocks touch: the whole file, hashed three ways
    if (!read_at(file.value, 0, *size, &block)) return false;
    const size_t length = block.size();
    const size_t tail = length > static_cast<size_t>(sampling.block_bytes)
                            ? length - static_cast<size_t>(sampling.block_bytes)
                            : 0;
    hash.update(block.data(), std::min(length, static_cast<size_t>(sampling.header_bytes)));
    hash.update(block.data(), length);
    hash.update(block.data() + tail, length - tail);
  } else {
    if (!read_at(file.value, 0, sampling.header_bytes, &block)) return false;
    hash.update(block.data(), block.size());
    for (int64_t offset = 0; offset < *size; offset += step) {
      if (!read_at(file.value, offset, sampling.block_bytes, &block)) return false;
      hash.update(block.data(), block.size());
    }
    if (!read_at(file.value, *size - sampling.block_bytes, sampling.block_bytes, &block)) {
      return false;
    }
    hash.update(block.data(), block.size());
  }
  *digest = hash.hexdigest();
  return true;
}

}  // namespace

uint32_t crc32(uint32_t running, const unsigned char* data, size_t size) {
  const auto& t = crc_tables().table;
  uint32_t crc = ~running;
  while (size >= 8) {
    const uint32_t low =
        crc ^ (static_cast<uint32_t>(data[0]) | static_cast<uint32_t>(data[1]) << 8 |
               static_cast<uint32_t>(data[2]) << 16 | static_cast<uint32_t>(data[3]) << 24);
    crc = t[7][low & 0xff] ^ t[6][(low >> 8) & 0xff] ^ t[5][(low >> 16) & 0xff] ^
          t[4][low >> 24] ^ t[3][data[4]] ^ t[2][data[5]] ^ t[1][data[6]] ^ t[0][data[7]];
    data += 8;
    size -= 8;
  }
  while (size--) crc = t[0][(crc ^ *data++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

Blake2b::Blake2b(size_t digest_size) : digest_size_(digest_size) {
  std::copy(kInitial, kInitial + 8, state_);
  state_[0] ^= 0x01010000ULL ^ static_cast<uint64_t>(digest_size);
}

void Blake2b::compress(const unsigned char* block, bool last) {
  uint64_t m[16];
  for (int n = 0; n < 16; ++n) m[n] = little_endian64(block + 8 * n);
  uint64_t v[16];
  std::copy(state_, state_ + 8, v);
  std::copy(kInitial, kInitial + 8, v + 8);
  v[12] ^= counter_[0];
  v[13] ^= counter_[1];
  if (last) v[14] = ~v[14];
  for (const auto& s : kSigma) {
    mix(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
    mix(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
    mix(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
    mix(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
    mix(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
    mix(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
    mix(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
    mix(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int n = 0; n < 8; ++n) state_[n] ^= v[n] ^ v[n + 8];
}

void Blake2b::update(const unsigned char* data, size_t size) {
  while (size > 0) {
    if (buffered_ == sizeof(buffer_)) {  // a full block, and more to come: not the last
      counter_[0] += sizeof(buffer_);
      if (counter_[0] < sizeof(buffer_)) ++counter_[1];
      compress(buffer_, false);
      buffered_ = 0;
    }
    const size_t taken = std::min(size, sizeof(buffer_) - buffered_);
    std::memcpy(buffer_ + buffered_, data, taken);
    buffered_ += taken;
    data += taken;
    size -= taken;
  }
}

std::string Blake2b::hexdigest() {
  counter_[0] += buffered_;
  if (counter_[0] < buffered_) ++counter_[1];
  std::memset(buffer_ + buffered_, 0, sizeof(buffer_) - buffered_);
  compress(buffer_, true);
  std::string text;
  char pair[3];
  for (size_t n = 0; n < digest_size_; ++n) {
    std::snprintf(pair, sizeof(pair), "%02x",
                  static_cast<unsigned>((state_[n / 8] >> (8 * (n % 8))) & 0xff));
    text += pair;
  }
  return text;
}

bool corpus_fingerprint_json(const std::string& idx_path, const std::string& bin_path,
                             const SampledBlocks& sampling, const std::vector<uint64_t>& opened,
                             std::string* json, std::string* failed_path) {
  const uint64_t* opened_idx = opened.empty() ? nullptr : opened.data();
  const uint64_t* opened_bin = opened.empty() ? nullptr : opened.data() + 2;
  const uint64_t* idx_modified = opened.empty() ? nullptr : opened.data() + 4;
  int64_t idx_bytes = 0;
  uint32_t idx_crc = 0;
  if (!idx_checksum(idx_path, opened_idx, idx_modified, &idx_bytes, &idx_crc)) {
    *failed_path = idx_path;
    return false;
  }
  int64_t bin_bytes = 0;
  std::string digest;
  if (!bin_hash(bin_path, sampling, opened_bin, &bin_bytes, &digest)) {
    *failed_path = bin_path;
    return false;
  }
  char crc_text[9];
  std::snprintf(crc_text, sizeof(crc_text), "%08x", idx_crc);
  *json = "{\"idx_bytes\": " + std::to_string(idx_bytes) + ", \"idx_crc32\": \"" + crc_text +
          "\", \"bin_bytes\": " + std::to_string(bin_bytes) + ", \"bin_hash\": \"" + digest +
          "\"}";
  return true;
}

}  // namespace megaindex
