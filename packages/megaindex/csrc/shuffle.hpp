// numpy.random.RandomState.shuffle, reproduced draw for draw, with the memory accesses
// prefetched: shuffling a 40M-entry document index is dominated by cache misses, so the swap
// targets of a block of steps are drawn first (without a branch on the rejected draws), then
// the block's swaps made, each target prefetched well ahead.
#pragma once

#include <cstdint>

namespace megaindex {

// The state of numpy's legacy MT19937 (RandomState.get_state()[1:3]).
struct Mt19937 {
  static constexpr int kSize = 624;
  uint32_t key[kSize];
  int pos;

  // The state numpy.random.RandomState(seed) starts in (numpy's legacy seeding of an integer).
  void seed(uint32_t value);
  uint32_t next32();
  uint64_t next64();
  // The next 624 words (pos back to 0).
  void regenerate();
};

// Shuffle data[0..n) exactly as RandomState.shuffle does (Fisher-Yates from the end, each
// index drawn by rejection under a bit mask), advancing `state` by the same draws.
template <typename T>
void legacy_shuffle(Mt19937& state, T* data, int64_t n);

extern template void legacy_shuffle<int32_t>(Mt19937&, int32_t*, int64_t);
extern template void legacy_shuffle<uint32_t>(Mt19937&, uint32_t*, int64_t);
extern template void legacy_shuffle<int64_t>(Mt19937&, int64_t*, int64_t);

}  // namespace megaindex
