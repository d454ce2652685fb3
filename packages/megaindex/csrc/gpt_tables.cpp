#include "gpt_tables.hpp"

#include <algorithm>

#include "shuffle.hpp"

namespace megaindex {

template <typename S, typename U>
SampleIndexStatus build_gpt_tables(const GptTablesInput& input, int32_t* document_index,
                                   S* sample_index, U* shuffle_index, int64_t* bad_position) {
  Mt19937 state;
  state.seed(input.seed);
  const int64_t per_epoch = input.num_documents;
  const int64_t documents = per_epoch * input.num_epochs;
  for (int32_t epoch = 0; epoch < input.num_epochs; ++epoch) {
    std::copy(input.documents, input.documents + per_epoch, document_index + epoch * per_epoch);
  }
  if (input.separate_final_epoch && input.num_epochs > 1) {
    legacy_shuffle(state, document_index, documents - per_epoch);
    legacy_shuffle(state, document_index + documents - per_epoch, per_epoch);
  } else {
    legacy_shuffle(state, document_index, documents);
  }
  const SampleIndexStatus status = build_sample_index<S>(
      input.sizes, input.num_sizes, document_index, documents, input.sequence_length,
      input.num_samples, input.add_extra_token, sample_index, bad_position);
  if (status != SampleIndexStatus::kOk) {
    return status;
  }
  for (int64_t sample = 0; sample < input.num_samples; ++sample) {
    shuffle_index[sample] = static_cast<U>(sample);
  }
  legacy_shuffle(state, shuffle_index, input.samples_first);
  legacy_shuffle(state, shuffle_index + input.samples_first,
                 input.num_samples - input.samples_first);
  return status;
}

template SampleIndexStatus build_gpt_tables<int32_t, uint32_t>(const GptTablesInput&, int32_t*,
                                                               int32_t*, uint32_t*, int64_t*);
template SampleIndexStatus build_gpt_tables<int32_t, int64_t>(const GptTablesInput&, int32_t*,
                                                              int32_t*, int64_t*, int64_t*);
template SampleIndexStatus build_gpt_tables<int64_t, uint32_t>(const GptTablesInput&, int32_t*,
                                                               int64_t*, uint32_t*, int64_t*);
template SampleIndexStatus build_gpt_tables<int64_t, int64_t>(const GptTablesInput&, int32_t*,
                                                              int64_t*, int64_t*, int64_t*);

}  // namespace megaindex
