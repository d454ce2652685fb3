#include "shuffle.hpp"

#include <algorithm>
#include <vector>

namespace megaindex {

namespace {

constexpr int kShift = 397;
constexpr uint32_t kMatrix = 0x9908b0dfU;
constexpr uint32_t kUpper = 0x80000000U;
constexpr uint32_t kLower = 0x7fffffffU;

// How many swaps ahead the targets are prefetched.
constexpr int64_t kAhead = 48;

inline uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

inline uint32_t twist(uint32_t upper, uint32_t lower, uint32_t shifted) {
  const uint32_t y = (upper & kUpper) | (lower & kLower);
  return shifted ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
}

// A uniform integer in [0, max], drawn as numpy's legacy random_interval draws it.
inline uint64_t interval(Mt19937& state, uint64_t max) {
  if (max == 0) {
    return 0;
  }
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (state.next32() & mask)) > max) {
    }
  } else {
    while ((value = (state.next64() & mask)) > max) {
    }
  }
  return value;
}

}  // namespace

void Mt19937::regenerate() {
  int k = 0;
  for (; k < kSize - kShift; ++k) {
    key[k] = twist(key[k], key[k + 1], key[k + kShift]);
  }
  for (; k < kSize - 1; ++k) {
    key[k] = twist(key[k], key[k + 1], key[k + kShift - kSize]);
  }
  key[kSize - 1] = twist(key[kSize - 1], key[0], key[kShift - 1]);
  pos = 0;
}

void Mt19937::seed(uint32_t value) {
  for (int k = 0; k < kSize; ++k) {
    key[k] = value;
    value = 1812433253U * (value ^ (value >> 30)) + static_cast<uint32_t>(k + 1);
  }
  pos = kSize;
}

uint32_t Mt19937::next32() {
  if (pos >= kSize) {
    regenerate();
  }
  return temper(key[pos++]);
}

uint64_t Mt19937::next64() {
  const uint64_t high = next32();
  return (high << 32) | next32();
}

namespace {

// Swap targets drawn at a time, then swapped (128 KB of them: they stay in cache).
constexpr int64_t kBlock = 1 << 14;

// The swap targets of steps [first, last) of a shuffle of n entries (step k swaps index
// i = n - 1 - k with one drawn in [0, i]), drawn as numpy draws them: a word under the mask of
// i, drawn again while above i. Below 2**32 the loop runs over the words rather than the steps,
// each word stored and the step advanced only when it is accepted: no branch on the
// rejections, which numpy's loop mispredicts about a quarter of the time. The words are
// tempered in a pass of their own (vectorized), and the mask is taken once for all the steps
// whose i has its bit length: what each word waits for is one compare and one subtract (1.6x
// faster than tempering and masking on the way). On a copy of the state, so that the compiler
// keeps it apart from the targets.
void draw_targets(Mt19937& state, int64_t n, int64_t first, int64_t last, int64_t* targets) {
  Mt19937 local = state;
  int64_t k = first;
  for (; k < last && static_cast<uint64_t>(n - 1 - k) > 0xffffffffULL; ++k) {
    targets[k - first] = static_cast<int64_t>(interval(local, static_cast<uint64_t>(n - 1 - k)));
  }
  uint32_t words[Mt19937::kSize];  // the key's words from `local.pos` on, tempered
  int tempered_from = Mt19937::kSize;
  while (k < last) {
    if (local.pos >= Mt19937::kSize) {
      local.regenerate();
      tempered_from = Mt19937::kSize;
    }
    if (tempered_from > local.pos) {
      for (int pos = local.pos; pos < Mt19937::kSize; ++pos) words[pos] = temper(local.key[pos]);
      tempered_from = local.pos;
    }
    // the mask of i = n - 1 - k (>= 1) holds while i keeps its bit length, up to step `until`
    const uint32_t mask = 0xffffffffU >> __builtin_clz(static_cast<uint32_t>(n - 1 - k));
    const int64_t until = std::min(last, n - 1 - static_cast<int64_t>(mask >> 1));
    // counted down by i (one compare and subtract a word), step k = n - 1 - i
    uint32_t i = static_cast<uint32_t>(n - 1 - k);
    const uint32_t stop = static_cast<uint32_t>(n - 1 - until);
    const int64_t top = n - 1 - first;  // step k's target is targets[top - i]
    int pos = local.pos;
    for (; pos < Mt19937::kSize && i > stop; ++pos) {
      const uint32_t value = words[pos] & mask;
      targets[top - static_cast<int64_t>(i)] = value;
      i -= value <= i ? 1U : 0U;
    }
    k = n - 1 - static_cast<int64_t>(i);
    local.pos = pos;
  }
  state = local;
}

// The swaps of steps [first, first + count), their targets known: each prefetched ahead.
template <typename T>
void swap_block(T* data, int64_t n, int64_t first, int64_t count, const int64_t* targets) {
  for (int64_t m = 0; m < kAhead && m < count; ++m) {
    __builtin_prefetch(data + targets[m], 1);
  }
  for (int64_t m = 0; m < count; ++m) {
    if (m + kAhead < count) {
      __builtin_prefetch(data + targets[m + kAhead], 1);
    }
    const int64_t i = n - 1 - (first + m);
    const T swapped = data[i];
    data[i] = data[targets[m]];
    data[targets[m]] = swapped;
  }
}

}  // namespace

template <typename T>
void legacy_shuffle(Mt19937& state, T* data, int64_t n) {
  const int64_t steps = n - 1;  // indices n - 1 down to 1
  if (steps <= 0) {
    return;
  }
  std::vector<int64_t> targets(static_cast<size_t>(std::min(steps, kBlock)));
  const int64_t size = static_cast<int64_t>(targets.size());
  for (int64_t first = 0; first < steps; first += size) {
    const int64_t count = std::min(size, steps - first);
    draw_targets(state, n, first, first + count, targets.data());
    swap_block(data, n, first, count, targets.data());
  }
}

template void legacy_shuffle<int32_t>(Mt19937&, int32_t*, int64_t);
template void legacy_shuffle<uint32_t>(Mt19937&, uint32_t*, int64_t);
template void legacy_shuffle<int64_t>(Mt19937&, int64_t*, int64_t);

}  // namespace megaindex
