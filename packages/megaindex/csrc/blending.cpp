#include "blending.hpp"

#include <algorithm>
#include <limits>
#include <vector>

namespace megaindex {

void build_blending_indices(const double* weights, int32_t num_datasets, int64_t size,
                            int16_t* dataset_index, int64_t* dataset_sample_index) {
  // Counts as doubles (exact far beyond any table's length): a lag is then one multiply and one
  // subtract, as the int64 count's conversion gives. The scan keeps kWays independent running
  // maxima (dataset d in way d % kWays), which the compiler keeps in vector registers; the
  // first dataset of the largest lag is the smallest index among the ways' ties.
  constexpr int32_t kWays = 4;
  const int32_t whole = num_datasets / kWays * kWays;
  std::vector<double> taken(num_datasets, 0.0);
  for (int64_t sample = 0; sample < size; ++sample) {
    const double progress = std::max(static_cast<double>(sample), 1.0);
    double largest[kWays];
    int32_t at[kWays];
    for (int32_t way = 0; way < kWays; ++way) {
      largest[way] = weights[0] * progress - taken[0];
      at[way] = 0;
    }
    for (int32_t first = 0; first < whole; first += kWays) {
      for (int32_t way = 0; way < kWays; ++way) {
        const double lag = weights[first + way] * progress - taken[first + way];
        const bool more = lag > largest[way];
        largest[way] = more ? lag : largest[way];
        at[way] = more ? first + way : at[way];
      }
    }
    for (int32_t dataset = whole; dataset < num_datasets; ++dataset) {
      const double lag = weights[dataset] * progress - taken[dataset];
      if (lag > largest[0]) {
        largest[0] = lag;
        at[0] = dataset;
      }
    }
    int32_t chosen = at[0];
    double most = largest[0];
    for (int32_t way = 1; way < kWays; ++way) {
      if (largest[way] > most || (largest[way] == most && at[way] < chosen)) {
        most = largest[way];
        chosen = at[way];
      }
    }
    dataset_index[sample] = static_cast<int16_t>(chosen);
    dataset_sample_index[sample] = static_cast<int64_t>(taken[chosen]);
    taken[chosen] += 1.0;
  }
}

void build_exhaustive_blending_indices(const int64_t* sizes, int32_t num_datasets,
                                       int16_t* dataset_index, int64_t* dataset_sample_index) {
  int64_t total = 0;
  for (int32_t dataset = 0; dataset < num_datasets; ++dataset) {
    total += sizes[dataset];
  }
  std::vector<double> weights(num_datasets);
  for (int32_t dataset = 0; dataset < num_datasets; ++dataset) {
    weights[dataset] = static_cast<double>(sizes[dataset]) / static_cast<double>(total);
  }
  // Datasets still drawing, in ascending order so ties go to the lowest id.
  std::vector<int32_t> open(num_datasets);
  for (int32_t dataset = 0; dataset < num_datasets; ++dataset) {
    open[dataset] = dataset;
  }
  std::vector<int64_t> taken(num_datasets, 0);
  for (int64_t sample = 0; !open.empty(); ++sample) {
    const double progress = std::max(static_cast<double>(sample), 1.0);
    size_t chosen_slot = 0;
    double largest = std::numeric_limits<double>::lowest();
    for (size_t slot = 0; slot < open.size(); ++slot) {
      const int32_t dataset = open[slot];
      const double lag = weights[dataset] * progress - static_cast<double>(taken[dataset]);
      if (lag > largest) {
        largest = lag;
        chosen_slot = slot;
      }
    }
    const int32_t chosen = open[chosen_slot];
    dataset_index[sample] = static_cast<int16_t>(chosen);
    dataset_sample_index[sample] = taken[chosen]++;
    if (taken[chosen] == sizes[chosen]) {
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(chosen_slot));
    }
  }
}

}  // namespace megaindex
