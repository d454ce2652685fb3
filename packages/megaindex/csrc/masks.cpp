#include "masks.hpp"

#include <cstring>

namespace megaindex {

void fill_document_causal_mask(const int64_t* segment_start, int64_t length, bool* out) {
  for (int64_t row = 0; row < length; ++row) {
    bool* line = out + row * length;
    const int64_t start = segment_start[row];
    std::memset(line, 1, static_cast<size_t>(start));
    std::memset(line + start, 0, static_cast<size_t>(row - start + 1));
    std::memset(line + row + 1, 1, static_cast<size_t>(length - row - 1));
  }
}

}  // namespace megaindex
