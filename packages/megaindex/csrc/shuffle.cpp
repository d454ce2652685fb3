#include "shuffle.hpp"

namespace megaindex {

namespace {

constexpr int kShift = 397;
constexpr uint32_t kMatrix = 0x9908b0dfU;
constexpr uint32_t kUpper = 0x80000000U;
constexpr uint32_t kLower = 0x7fffffffU;

// How many swaps ahead the targets are drawn and prefetched.
constexpr int64_t kAhead = 16;

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

uint32_t Mt19937::next32() {
  if (pos >= kSize) {
    regenerate();
  }
  uint32_t y = key[pos++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

uint64_t Mt19937::next64() {
  const uint64_t high = next32();
  return (high << 32) | next32();
}

template <typename T>
void legacy_shuffle(Mt19937& state, T* data, int64_t n) {
  // targets[k % kAhead] holds the swap target of index n - 1 - k, drawn in numpy's order
  int64_t targets[kAhead];
  const int64_t steps = n - 1;  // indices n - 1 down to 1
  for (int64_t k = 0; k < kAhead && k < steps; ++k) {
    targets[k] = static_cast<int64_t>(interval(state, static_cast<uint64_t>(n - 1 - k)));
    __builtin_prefetch(data + targets[k], 1);
  }
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t i = n - 1 - k;
    const int64_t j = targets[k % kAhead];
    if (k + kAhead < steps) {
      const int64_t later = k + kAhead;
      targets[later % kAhead] =
          static_cast<int64_t>(interval(state, static_cast<uint64_t>(n - 1 - later)));
      __builtin_prefetch(data + targets[later % kAhead], 1);
    }
    const T swapped = data[i];
    data[i] = data[j];
    data[j] = swapped;
  }
}

template void legacy_shuffle<int32_t>(Mt19937&, int32_t*, int64_t);
template void legacy_shuffle<uint32_t>(Mt19937&, uint32_t*, int64_t);
template void legacy_shuffle<int64_t>(Mt19937&, int64_t*, int64_t);

}  // namespace megaindex
