// GPTDataset's three tables of one split in a single call from the seed: the document index
// (the split's documents once per epoch, shuffled), the sample index (its walk) and the shuffle
// index, drawn from numpy.random.RandomState(seed) in megatron-core's order. A blend of
// thousands of small corpora builds thousands of these; one call spares each the Python steps
// between them (the generator's state handed to numpy and back, the arrays made one by one).
#pragma once

#include <cstdint>

#include "sample_index.hpp"

namespace megaindex {

struct GptTablesInput {
  const int32_t* sizes;  // the corpus's sequence lengths, by document id
  int64_t num_sizes;
  const int32_t* documents;  // the split's document ids, in order
  int64_t num_documents;
  int32_t num_epochs;
  bool separate_final_epoch;  // the last epoch shuffled on its own
  uint32_t seed;
  int32_t sequence_length;
  int32_t add_extra_token;  // 0 or 1
  int64_t num_samples;      // rows of the sample index minus one, entries of the shuffle index
  int64_t samples_first;    // the samples before the last epoch, shuffled apart from the rest
};

// Fill `document_index` (num_epochs * num_documents entries), `sample_index` (2 * (num_samples
// + 1) values) and `shuffle_index` (num_samples entries). On kDocumentOutOfRange the walk met a
// document id outside `sizes` at `*bad_position` of the document index, and the shuffle index
// is not filled.
template <typename S, typename U>
SampleIndexStatus build_gpt_tables(const GptTablesInput& input, int32_t* document_index,
                                   S* sample_index, U* shuffle_index, int64_t* bad_position);

extern template SampleIndexStatus build_gpt_tables<int32_t, uint32_t>(const GptTablesInput&,
                                                                      int32_t*, int32_t*,
                                                                      uint32_t*, int64_t*);
extern template SampleIndexStatus build_gpt_tables<int32_t, int64_t>(const GptTablesInput&,
                                                                     int32_t*, int32_t*, int64_t*,
                                                                     int64_t*);
extern template SampleIndexStatus build_gpt_tables<int64_t, uint32_t>(const GptTablesInput&,
                                                                      int32_t*, int64_t*,
                                                                      uint32_t*, int64_t*);
extern template SampleIndexStatus build_gpt_tables<int64_t, int64_t>(const GptTablesInput&,
                                                                     int32_t*, int64_t*, int64_t*,
                                                                     int64_t*);

}  // namespace megaindex
