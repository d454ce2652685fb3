#include "blending.hpp"

#include <algorithm>
#include <limits>
#include <vector>

namespace megaindex {

void build_blending_indices(const double* weights, int32_t num_datasets, int64_t size,
                            int16_t* dataset_index, int64_t* dataset_sample_index) {
  std::vector<int64_t> taken(num_datasets, 0);
  for (int64_t sample = 0; sample < size; ++sample) {
    const double progress = std::max(static_cast<double>(sample), 1.0);
    int32_t chosen = 0;
    double largest = weights[0] * progress - static_cast<double>(taken[0]);
    for (int32_t dataset = 1; dataset < num_datasets; ++dataset) {
      const double lag = weights[dataset] * progress - static_cast<double>(taken[dataset]);
      if (lag > largest) {
        largest = lag;
        chosen = dataset;
      }
    }
    dataset_index[sample] = static_cast<int16_t>(chosen);
    dataset_sample_index[sample] = taken[chosen]++;
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
