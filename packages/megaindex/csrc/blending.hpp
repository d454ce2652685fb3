// Interleaving samples of several datasets so every prefix of the blend follows the weights.
#pragma once

#include <cstdint>

namespace megaindex {

// For each of `size` samples, choose the dataset whose count lags its weight the most
// (weights[d] * max(i, 1) - count[d], the first dataset on ties) and record the dataset and
// the running count of samples taken from it.
void build_blending_indices(const double* weights, int32_t num_datasets, int64_t size,
                            int16_t* dataset_index, int64_t* dataset_sample_index);

// Like build_blending_indices with weights sizes[d] / sum(sizes), but a dataset leaves the
// draw once sizes[d] samples were taken from it, so every sample of every dataset is used
// exactly once. `sizes` must all be positive; the output holds sum(sizes) entries.
void build_exhaustive_blending_indices(const int64_t* sizes, int32_t num_datasets,
                                       int16_t* dataset_index, int64_t* dataset_sample_index);

}  // namespace megaindex
