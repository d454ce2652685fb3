// Fill-in-the-middle: laying out a sample whose pieces were rearranged.
#pragma once

#include <cstdint>

namespace megaindex {

// Writes the runs of tokens `runs` lists (`count` rows of three: source, start, stop) one after
// another into `out` (`width` entries). Source 0 is the original `sample`, source 1 the
// `inserted` tokens (sentinels and re-encoded text); a run takes [start, stop) of its source.
// Tokens past `width` are dropped and a shorter result is filled up with `pad`, so the sample
// keeps its length. Returns how many tokens the runs hold before that cut.
// Every run is checked before anything is written: a source other than 0 or 1, or a range
// outside its source, throws std::out_of_range naming the run, and `out` is left untouched.
int64_t fim_assemble(const int64_t* sample, int64_t sample_size, const int64_t* inserted,
                     int64_t inserted_size, const int64_t* runs, int64_t count, int64_t* out,
                     int64_t width, int64_t pad);

}  // namespace megaindex
