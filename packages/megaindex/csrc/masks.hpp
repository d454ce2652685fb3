// Attention masks for samples that pack several documents.
#pragma once

#include <cstdint>

namespace megaindex {

// Fill the `length` x `length` boolean mask `out` (true = masked) for causal attention within
// documents: row r may attend to columns segment_start[r] .. r, where segment_start[r] is where
// the document holding token r begins inside the sample. Rows are split over `threads` threads:
// filling (and first touching) a fresh 16 MB mask is bound by memory bandwidth per core.
// Throws std::out_of_range, naming the row, for a segment_start outside 0..row; `out` is then
// left untouched.
void fill_document_causal_mask(const int64_t* segment_start, int64_t length, bool* out,
                               int threads);

}  // namespace megaindex
