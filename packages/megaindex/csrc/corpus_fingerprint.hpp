// The fingerprint megafmt.fingerprint.corpus_fingerprint takes of a local corpus, computed by the
// threads that write a blend's cache files (without the GIL): the .idx's size and CRC-32 (zlib's)
// and a BLAKE2b-128 digest of blocks sampled through the .bin. megafmt's Python function stays
// the definition (a URL's corpus, large tables, the comparison at load); this one is tested
// equal to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace megaindex {

// zlib's crc32(): the CRC-32 of `size` bytes, continuing `running`.
uint32_t crc32(uint32_t running, const unsigned char* data, size_t size);

// BLAKE2b (RFC 7693) without a key, `digest_size` bytes (1..64) of digest.
class Blake2b {
 public:
  explicit Blake2b(size_t digest_size);
  void update(const unsigned char* data, size_t size);
  // The digest in lowercase hex; the object is spent.
  std::string hexdigest();

 private:
  void compress(const unsigned char* block, bool last);
  uint64_t state_[8];
  uint64_t counter_[2] = {0, 0};
  unsigned char buffer_[128];
  size_t buffered_ = 0;
  size_t digest_size_;
};

// How megafmt samples a .bin: its first `header_bytes`, then `block_bytes` every
// max(size / blocks, block_bytes) bytes, then its last `block_bytes`.
struct SampledBlocks {
  int64_t header_bytes;
  int64_t blocks;
  int64_t block_bytes;
};

// The fingerprint as JSON text, {"idx_bytes": ..., "idx_crc32": "...", "bin_bytes": ...,
// "bin_hash": "..."}; false (errno set, `failed_path` naming the file) when a file cannot be
// read. With `opened` (five values: the .idx's size and inode, the .bin's, then the .idx's
// modification time in ns), a file that is not the one opened then (replaced by a rename, or
// cut or grown), or an .idx written since (in place: another modification time), fails with
// ESTALE: its fingerprint would describe other data than the tables'. A .bin's times are not
// compared: the tables are not cut from it.
bool corpus_fingerprint_json(const std::string& idx_path, const std::string& bin_path,
                             const SampledBlocks& sampling, const std::vector<uint64_t>& opened,
                             std::string* json, std::string* failed_path);

}  // namespace megaindex
