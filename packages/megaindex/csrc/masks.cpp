#include "masks.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace megaindex {

namespace {

void fill_rows(const int64_t* segment_start, int64_t length, bool* out, int64_t first,
               int64_t last) {
  for (int64_t row = first; row < last; ++row) {
    bool* line = out + row * length;
    const int64_t start = segment_start[row];
    std::memset(line, 1, static_cast<size_t>(start));
    std::memset(line + start, 0, static_cast<size_t>(row - start + 1));
    std::memset(line + row + 1, 1, static_cast<size_t>(length - row - 1));
  }
}

// Below this many rows a thread costs more than it saves.
constexpr int64_t kRowsPerThread = 256;

}  // namespace

void fill_document_causal_mask(const int64_t* segment_start, int64_t length, bool* out,
                               int threads) {
  // checked before any thread starts: a start outside 0..row would write outside the row
  for (int64_t row = 0; row < length; ++row) {
    if (segment_start[row] < 0 || segment_start[row] > row) {
      throw std::out_of_range("segment_start[" + std::to_string(row) + "] = " +
                              std::to_string(segment_start[row]) + " is outside 0.." +
                              std::to_string(row));
    }
  }
  const int64_t workers = std::max<int64_t>(
      1, std::min<int64_t>(threads, length / kRowsPerThread));
  const int64_t rows_each = (length + workers - 1) / workers;
  std::vector<std::thread> helpers;
  for (int64_t worker = 1; worker < workers; ++worker) {
    const int64_t first = worker * rows_each;
    const int64_t last = std::min(length, first + rows_each);
    helpers.emplace_back(fill_rows, segment_start, length, out, first, last);
  }
  fill_rows(segment_start, length, out, 0, std::min(length, rows_each));
  for (std::thread& helper : helpers) {
    helper.join();
  }
}

}  // namespace megaindex
