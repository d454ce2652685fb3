#include "sample_index.hpp"

#include <cmath>

namespace megaindex {

namespace {

// How many documents ahead of the walk their sizes are prefetched: the document ids are in
// shuffled order, so without it nearly every size read is a cache (and TLB) miss.
constexpr int64_t kAhead = 32;

}  // namespace

int64_t sample_count(int32_t num_epochs, int64_t tokens_per_epoch, int32_t sequence_length,
                     bool drop_last_partial_sequence, int32_t add_extra_token) {
  const int64_t usable = num_epochs * tokens_per_epoch - add_extra_token;
  if (drop_last_partial_sequence) {
    return usable / sequence_length;
  }
  // Single precision on purpose: the reference rounds through a float here.
  const float quotient = static_cast<float>(usable) / static_cast<float>(sequence_length);
  return static_cast<int64_t>(std::ceil(quotient));
}

template <typename T>
SampleIndexStatus fill_sample_index(const int32_t* sizes, int64_t num_sizes,
                                    const int32_t* document_index, int64_t num_documents,
                                    int32_t sequence_length, int32_t add_extra_token, T* out,
                                    int64_t first_row, int64_t last_row, int64_t* bad_position) {
  // The document id at a stream position, range-checked once per position visited.
  auto document_size = [&](int64_t position, int64_t* size) {
    const int32_t id = document_index[position];
    if (id < 0 || id >= num_sizes) {
      *bad_position = position;
      return false;
    }
    *size = sizes[id];
    return true;
  };

  // Prefetch the size of the document `position` (ids out of range are left to the check).
  auto prefetch = [&](int64_t position) {
    if (position < num_documents) {
      const int32_t id = document_index[position];
      if (id >= 0 && id < num_sizes) {
        __builtin_prefetch(sizes + id);
      }
    }
  };

  if (first_row == 0 && last_row > 0) {  // the first sample starts the stream
    out[0] = 0;
    out[1] = 0;
    first_row = 1;
  }
  if (first_row >= last_row) {
    return SampleIndexStatus::kOk;
  }
  // the row before holds where the walk stands: the document's position and the offset in it
  int64_t position = static_cast<int64_t>(out[2 * (first_row - 1)]);
  int64_t offset = static_cast<int64_t>(out[2 * (first_row - 1) + 1]);
  for (int64_t ahead = 0; ahead < kAhead; ++ahead) {
    prefetch(position + ahead);
  }
  for (int64_t row = first_row; row < last_row; ++row) {
    // Tokens this sample still needs, the shared extra token included.
    int64_t needed = static_cast<int64_t>(sequence_length) + add_extra_token;
    while (needed != 0) {
      int64_t size = 0;
      if (!document_size(position, &size)) {
        return SampleIndexStatus::kDocumentOutOfRange;
      }
      const int64_t available = size - offset;
      needed -= available;
      if (needed <= 0) {
        // The sample ends in this document; the next one starts sequence_length tokens after
        // this one began, that is, before the extra token.
        offset += needed + available - add_extra_token;
        needed = 0;
      } else if (position == num_documents - 1) {
        // The stream is exhausted: park on its last token (the last, partial sample).
        offset = size - add_extra_token;
        break;
      } else {
        ++position;
        offset = 0;
        prefetch(position + kAhead);
      }
    }
    out[2 * row] = static_cast<T>(position);
    out[2 * row + 1] = static_cast<T>(offset);
  }
  return SampleIndexStatus::kOk;
}

template <typename T>
SampleIndexStatus build_sample_index(const int32_t* sizes, int64_t num_sizes,
                                     const int32_t* document_index, int64_t num_documents,
                                     int32_t sequence_length, int64_t num_samples,
                                     int32_t add_extra_token, T* out, int64_t* bad_position) {
  return fill_sample_index<T>(sizes, num_sizes, document_index, num_documents, sequence_length,
                              add_extra_token, out, 0, num_samples + 1, bad_position);
}

template SampleIndexStatus build_sample_index<int32_t>(const int32_t*, int64_t, const int32_t*,
                                                       int64_t, int32_t, int64_t, int32_t,
                                                       int32_t*, int64_t*);
template SampleIndexStatus build_sample_index<int64_t>(const int32_t*, int64_t, const int32_t*,
                                                       int64_t, int32_t, int64_t, int32_t,
                                                       int64_t*, int64_t*);
template SampleIndexStatus fill_sample_index<int32_t>(const int32_t*, int64_t, const int32_t*,
                                                      int64_t, int32_t, int32_t, int32_t*,
                                                      int64_t, int64_t, int64_t*);
template SampleIndexStatus fill_sample_index<int64_t>(const int32_t*, int64_t, const int32_t*,
                                                      int64_t, int32_t, int32_t, int64_t*,
                                                      int64_t, int64_t, int64_t*);

}  // namespace megaindex
