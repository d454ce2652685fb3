// Cutting a shuffled stream of documents into fixed-length samples (GPTDataset's sample index).
//
// Plain C++ over pointers and sizes: no Python, so it can be tested and reused on its own.
#pragma once

#include <cstdint>

namespace megaindex {

// Why a build stopped early; kOk when the output is complete.
enum class SampleIndexStatus { kOk, kDocumentOutOfRange };

// Number of samples a stream of `num_epochs * tokens_per_epoch` tokens yields. With
// `drop_last_partial_sequence` false the last, shorter sample counts too; that count is taken
// in single precision, exactly as megatron-core does, so both agree to the row.
int64_t sample_count(int32_t num_epochs, int64_t tokens_per_epoch, int32_t sequence_length,
                     bool drop_last_partial_sequence, int32_t add_extra_token);

// Fill `out` (2 * (num_samples + 1) values) with the (position in document_index, token offset)
// where each sample starts, the last row marking where the final sample ends. `sizes` holds the
// token count of every document id; `document_index` the document ids in stream order. Each
// sample spans `sequence_length + add_extra_token` tokens, and the next starts
// `sequence_length` tokens after it (the extra token is shared). When the stream runs out before
// `num_samples` rows are written, the remaining rows repeat the stream's last position.
// `bad_position` receives the offending document_index position on kDocumentOutOfRange.
template <typename T>
SampleIndexStatus build_sample_index(const int32_t* sizes, int64_t num_sizes,
                                     const int32_t* document_index, int64_t num_documents,
                                     int32_t sequence_length, int64_t num_samples,
                                     int32_t add_extra_token, T* out, int64_t* bad_position);

// Rows [first_row, last_row) of the same sample index, the walk resumed from row first_row - 1
// (which must hold a position inside document_index); row 0 is (0, 0). Filling a large index a
// slice of rows at a time lets the caller release the part of document_index walked so far.
template <typename T>
SampleIndexStatus fill_sample_index(const int32_t* sizes, int64_t num_sizes,
                                    const int32_t* document_index, int64_t num_documents,
                                    int32_t sequence_length, int32_t add_extra_token, T* out,
                                    int64_t first_row, int64_t last_row, int64_t* bad_position);

extern template SampleIndexStatus build_sample_index<int32_t>(
    const int32_t*, int64_t, const int32_t*, int64_t, int32_t, int64_t, int32_t, int32_t*,
    int64_t*);
extern template SampleIndexStatus build_sample_index<int64_t>(
    const int32_t*, int64_t, const int32_t*, int64_t, int32_t, int64_t, int32_t, int64_t*,
    int64_t*);
extern template SampleIndexStatus fill_sample_index<int32_t>(const int32_t*, int64_t,
                                                             const int32_t*, int64_t, int32_t,
                                                             int32_t, int32_t*, int64_t, int64_t,
                                                             int64_t*);
extern template SampleIndexStatus fill_sample_index<int64_t>(const int32_t*, int64_t,
                                                             const int32_t*, int64_t, int32_t,
                                                             int32_t, int64_t*, int64_t, int64_t,
                                                             int64_t*);

}  // namespace megaindex
