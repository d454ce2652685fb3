#include "fim.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megaindex {

int64_t fim_assemble(const int64_t* sample, int64_t sample_size, const int64_t* inserted,
                     int64_t inserted_size, const int64_t* runs, int64_t count, int64_t* out,
                     int64_t width, int64_t pad) {
  int64_t total = 0;
  for (int64_t run = 0; run < count; ++run) {
    const int64_t source = runs[3 * run];
    const int64_t start = runs[3 * run + 1];
    const int64_t stop = runs[3 * run + 2];
    const int64_t size = source == 0 ? sample_size : inserted_size;
    if ((source != 0 && source != 1) || start < 0 || stop < start || stop > size) {
      throw std::out_of_range("run " + std::to_string(run) + " = (" + std::to_string(source) +
                              ", " + std::to_string(start) + ", " + std::to_string(stop) +
                              "): expected source 0 (sample, " + std::to_string(sample_size) +
                              " tokens) or 1 (inserted, " + std::to_string(inserted_size) +
                              " tokens) and 0 <= start <= stop <= its size");
    }
    total += stop - start;
  }
  int64_t written = 0;
  for (int64_t run = 0; run < count && written < width; ++run) {
    const int64_t* from = (runs[3 * run] == 0 ? sample : inserted) + runs[3 * run + 1];
    const int64_t take = std::min(runs[3 * run + 2] - runs[3 * run + 1], width - written);
    std::copy(from, from + take, out + written);
    written += take;
  }
  std::fill(out + written, out + width, pad);
  return total;
}

}  // namespace megaindex
