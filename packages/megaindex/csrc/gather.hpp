// GPT samples' tokens, gathered from the whole .bin at once: for each sample of a batch, the
// documents it spans, from an offset in the first to an offset in the last, widened to int64.
// Replaces a Python loop of one read per document (about 1.4 us each) with one call per batch.
//
// Every value read from the tables is checked before it is used: a corrupt index raises
// std::out_of_range naming the sample, the document and the value, and nothing outside the
// arrays is read or written. No sum is formed before it is known to fit.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace megaindex {

// The tables GPTDataset reads a sample through, and the .bin they point into.
template <typename Token, typename Position, typename Order>
struct WindowTables {
  const Token* tokens;
  int64_t num_tokens;
  const int64_t* pointers;  // byte offset of each sequence in tokens
  const int32_t* lengths;   // token count of each sequence
  int64_t num_sequences;
  const int32_t* document_index;
  int64_t num_documents;
  const Position* sample_index;  // (position in document_index, token offset) pairs
  int64_t num_sample_rows;
  const Order* shuffle_index;
  int64_t num_shuffled;
};

namespace detail {

// a + b (b is 0 or 1) as text, exact even where the int64 sum would wrap.
inline std::string sum_text(int64_t a, int64_t b) {
  return a >= 0 ? std::to_string(static_cast<uint64_t>(a) + static_cast<uint64_t>(b))
                : std::to_string(a + b);
}

[[noreturn]] inline void fail(int64_t sample, const std::string& what) {
  throw std::out_of_range("sample " + std::to_string(sample) + ": " + what);
}

}  // namespace detail

// Writes dataset sample samples[row]'s tokens into out[row * width ...]: with s =
// shuffle_index[samples[row]], the documents document_index[begin..end] between the rows s and
// s + 1 of sample_index, the first from its begin offset, the last up to its end offset + extra
// (exclusive), those between whole. written[row] receives the count; later positions of the
// row are left as they are. Rows are filled in order; an error leaves the rows before it filled.
template <typename Token, typename Position, typename Order>
void gather_windows(const WindowTables<Token, Position, Order>& tables, const int64_t* samples,
                    int64_t num_rows, int64_t extra, int64_t* out, int64_t width,
                    int64_t* written) {
  constexpr int64_t kItemsize = static_cast<int64_t>(sizeof(Token));
  for (int64_t row = 0; row < num_rows; ++row) {
    const int64_t sample = samples[row];
    if (sample < 0 || sample >= tables.num_shuffled) {
      detail::fail(sample, "outside shuffle_index's " + std::to_string(tables.num_shuffled) +
                               " entries");
    }
    const int64_t shuffled = static_cast<int64_t>(tables.shuffle_index[sample]);
    if (shuffled < 0 || shuffled >= tables.num_sample_rows - 1) {
      detail::fail(sample, "shuffle_index[" + std::to_string(sample) + "] = " +
                               std::to_string(shuffled) + " needs rows outside sample_index's " +
                               std::to_string(tables.num_sample_rows));
    }
    const Position* bounds = tables.sample_index + 2 * shuffled;
    const int64_t begin = bounds[0];
    const int64_t begin_offset = bounds[1];
    const int64_t end = bounds[2];
    const int64_t end_offset = bounds[3];
    if (begin < 0 || end < begin || end >= tables.num_documents) {
      detail::fail(sample, "spans document_index[" + std::to_string(begin) + ".." +
                               std::to_string(end) + "], outside its " +
                               std::to_string(tables.num_documents) + " entries");
    }
    int64_t* line = out + row * width;
    int64_t count = 0;
    for (int64_t position = begin; position <= end; ++position) {
      const int64_t document = tables.document_index[position];
      if (document < 0 || document >= tables.num_sequences) {
        detail::fail(sample, "document " + std::to_string(document) + " at document_index[" +
                                 std::to_string(position) + "] is not one of the " +
                                 std::to_string(tables.num_sequences) + " sequences");
      }
      const int64_t size = tables.lengths[document];
      const int64_t pointer = tables.pointers[document];
      if (pointer < 0 || pointer % kItemsize != 0) {
        detail::fail(sample, "document " + std::to_string(document) + " starts at byte " +
                                 std::to_string(pointer) + ", not a token boundary of the .bin");
      }
      const int64_t base = pointer / kItemsize;
      if (base > tables.num_tokens) {
        detail::fail(sample, "document " + std::to_string(document) + " starts at byte " +
                                 std::to_string(pointer) + ", past the end of the .bin (" +
                                 std::to_string(tables.num_tokens * kItemsize) + " bytes)");
      }
      const int64_t first = position == begin ? begin_offset : 0;
      // size - extra cannot wrap: size is an int32, extra 0 or 1
      const bool last_fits = position == end ? end_offset <= size - extra : true;
      const int64_t last = !last_fits ? 0 : position == end ? end_offset + extra : size;
      if (!last_fits || first < 0 || last < first) {
        const std::string last_text = position == end ? detail::sum_text(end_offset, extra)
                                                      : std::to_string(size);
        detail::fail(sample, "tokens [" + std::to_string(first) + ", " + last_text +
                                 ") are outside document " + std::to_string(document) +
                                 ", which has " + std::to_string(size));
      }
      if (last > tables.num_tokens - base) {
        detail::fail(sample, "document " + std::to_string(document) + " needs tokens up to " +
                                 std::to_string(last) + " from token " + std::to_string(base) +
                                 ", past the end of the .bin (" +
                                 std::to_string(tables.num_tokens) + " tokens)");
      }
      const int64_t span = last - first;
      if (span > width - count) {
        detail::fail(sample, "needs room for more than the " + std::to_string(width) +
                                 " tokens of a row of out");
      }
      const Token* source = tables.tokens + base + first;
      for (int64_t i = 0; i < span; ++i) {
        line[count + i] = static_cast<int64_t>(source[i]);
      }
      count += span;
    }
    written[row] = count;
  }
}

}  // namespace megaindex
