#include "blending.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace megaindex {

namespace {

// Every dataset's lag at every sample: few datasets, or weights the tree cannot reason about.
void scan_blending_indices(const double* weights, int32_t num_datasets, int64_t size,
                           int16_t* dataset_index, int64_t* dataset_sample_index) {
  // Counts as doubles (exact far beyond any table's length): a lag is then one multiply and one
  // subtract, as the int64 count's conversion gives. The scan keeps kWays independent running
  // maxima (dataset d in way d % kWays), which the compiler keeps in vector registers; the
  // first dataset of the largest lag is the smallest index among the ways' ties.
  constexpr int32_t kWays = 4;
  const int32_t whole = num_datasets / kWays * kWays;
  std::vector<double> taken(num_datasets, 0.0);
  for (int64_t sample = 0; sample < size; ++sample) {
    const double progress = std::max(static_cast<double>(sample), 1.0);
    double largest[kWays];
    int32_t at[kWays];
    for (int32_t way = 0; way < kWays; ++way) {
      largest[way] = weights[0] * progress - taken[0];
      at[way] = 0;
    }
    for (int32_t first = 0; first < whole; first += kWays) {
      for (int32_t way = 0; way < kWays; ++way) {
        const double lag = weights[first + way] * progress - taken[first + way];
        const bool more = lag > largest[way];
        largest[way] = more ? lag : largest[way];
        at[way] = more ? first + way : at[way];
      }
    }
    for (int32_t dataset = whole; dataset < num_datasets; ++dataset) {
      const double lag = weights[dataset] * progress - taken[dataset];
      if (lag > largest[0]) {
        largest[0] = lag;
        at[0] = dataset;
      }
    }
    int32_t chosen = at[0];
    double most = largest[0];
    for (int32_t way = 1; way < kWays; ++way) {
      if (largest[way] > most || (largest[way] == most && at[way] < chosen)) {
        most = largest[way];
        chosen = at[way];
      }
    }
    dataset_index[sample] = static_cast<int16_t>(chosen);
    dataset_sample_index[sample] = static_cast<int64_t>(taken[chosen]);
    taken[chosen] += 1.0;
  }
}

// The same choices from a tournament tree over the datasets: each node holds the dataset of
// the largest lag in its subtree (the lowest id on ties) and the first sample at which that
// could change, when one of its children's could, or when the other child's dataset catches up
// (a lag grows by its weight per sample: the lines of two datasets cross once). Only the nodes
// due are compared again, and the path of the dataset taken. The leaves hold the datasets by
// weight, heaviest first: siblings of like weight take long to catch up with each other, so a
// sample of a blend whose weights spread over orders of magnitude compares a dozen nodes, not
// the 75 that leaves in id order do at 2,400 datasets (a sixth of the time). Where two lags are
// within what rounding can move them (`slack`), the node is compared again at every sample
// until they part, so each choice is the one the scan, computing the same lags in the same
// doubles, makes.
class LagTree {
 public:
  LagTree(const double* weights, int32_t num_datasets, int64_t size)
      : weights_(weights), taken_(num_datasets, 0.0) {
    while (leaves_ < num_datasets) leaves_ <<= 1;
    winner_.assign(2 * static_cast<size_t>(leaves_), kNone);
    due_.assign(2 * static_cast<size_t>(leaves_), kNever);
    std::vector<int32_t> by_weight(num_datasets);
    for (int32_t dataset = 0; dataset < num_datasets; ++dataset) by_weight[dataset] = dataset;
    std::stable_sort(by_weight.begin(), by_weight.end(),
                     [weights](int32_t a, int32_t b) { return weights[a] > weights[b]; });
    leaf_.assign(num_datasets, 0);
    for (int32_t leaf = 0; leaf < num_datasets; ++leaf) {
      winner_[leaves_ + leaf] = by_weight[leaf];
      leaf_[by_weight[leaf]] = leaf;
    }
    for (int32_t node = 1; node < leaves_; ++node) due_[node] = 0;
    // a lag w * p - t is off by at most 2^-52 (w p + |lag|) <= 2^-52 (2 size + 2) after its two
    // roundings; the difference of two, by twice that; four times more for the margin
    slack_ = 16.0 * std::ldexp(1.0, -52) * (static_cast<double>(size) + 2.0);
  }

  int32_t choose(int64_t sample) {
    refresh(1, sample);
    return winner_[1];
  }

  double taken(int32_t dataset) const { return taken_[dataset]; }

  // The dataset was taken at `sample`: its path is compared again at the next.
  void take(int32_t dataset, int64_t sample) {
    taken_[dataset] += 1.0;
    refresh_path(dataset, sample);
  }

  // The dataset leaves the draw after `sample` (exhaustive blending: all of it was taken).
  void leave(int32_t dataset, int64_t sample) {
    winner_[leaves_ + leaf_[dataset]] = kNone;
    refresh_path(dataset, sample);
  }

 private:
  static constexpr int32_t kNone = -1;
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  void refresh_path(int32_t dataset, int64_t sample) {
    for (int32_t node = (leaves_ + leaf_[dataset]) >> 1; node >= 1; node >>= 1) {
      due_[node] = sample + 1;
    }
  }

  double lag(int32_t dataset, double progress) const {
    return weights_[dataset] * progress - taken_[dataset];
  }

  void refresh(int32_t node, int64_t sample) {
    if (node >= leaves_ || due_[node] > sample) return;
    refresh(2 * node, sample);
    refresh(2 * node + 1, sample);
    combine(node, sample);
  }

  void combine(int32_t node, int64_t sample) {
    const int32_t left = winner_[2 * node], right = winner_[2 * node + 1];
    const int64_t children = std::min(due_[2 * node], due_[2 * node + 1]);
    if (left == kNone || right == kNone) {
      winner_[node] = left == kNone ? right : left;
      due_[node] = children;
      return;
    }
    const double progress = std::max(static_cast<double>(sample), 1.0);
    const double left_lag = lag(left, progress), right_lag = lag(right, progress);
    const bool right_wins = right_lag > left_lag || (right_lag == left_lag && right < left);
    const int32_t winner = right_wins ? right : left, loser = right_wins ? left : right;
    const double lead = right_wins ? right_lag - left_lag : left_lag - right_lag;
    int64_t parting;
    if (sample < 2) {  // the lags grow from sample 1 on (max(i, 1))
      parting = sample + 1;
    } else if (weights_[loser] == weights_[winner]) {
      parting = kNever;  // the same growth: the counts decide, and they change only by a take
    } else if (lead <= slack_) {
      parting = sample + 1;  // too close to call ahead
    } else if (weights_[loser] < weights_[winner]) {
      parting = kNever;  // the lead only grows
    } else {
      const double samples = (lead - slack_) / (weights_[loser] - weights_[winner]);
      parting = samples > 9e15 ? kNever
                               : sample + std::max<int64_t>(1, static_cast<int64_t>(samples) - 2);
    }
    winner_[node] = winner;
    due_[node] = std::min(children, parting);
  }

  const double* weights_;
  std::vector<double> taken_;
  int32_t leaves_ = 1;
  std::vector<int32_t> winner_;
  std::vector<int32_t> leaf_;  // each dataset's leaf
  std::vector<int64_t> due_;
  double slack_ = 0.0;
};

// Below this many datasets the scan's vectorized pass is about as fast as the tree (2,000,000
// samples of 16 datasets: 1x to 1.05x of the tree's time; of 64, the tree takes 0.8x with weights
// spread over four orders of magnitude, 0.8x uniformly random, 0.9x equal; of 1,024, 0.3x,
// 0.3x and 0.1x; of 2,400, 0.15x, 0.17x and 0.05x).
constexpr int32_t kTreeFrom = 64;

}  // namespace

void build_blending_indices(const double* weights, int32_t num_datasets, int64_t size,
                            int16_t* dataset_index, int64_t* dataset_sample_index) {
  // the tree's rounding margin holds for lags of at most the sample count: weights in [0, 1]
  // (a blend's, normalized; the helper takes any)
  const bool fractions = std::all_of(weights, weights + num_datasets,
                                     [](double weight) { return weight >= 0.0 && weight <= 1.0; });
  if (num_datasets < kTreeFrom || !fractions) {
    scan_blending_indices(weights, num_datasets, size, dataset_index, dataset_sample_index);
    return;
  }
  LagTree tree(weights, num_datasets, size);
  for (int64_t sample = 0; sample < size; ++sample) {
    const int32_t chosen = tree.choose(sample);
    dataset_index[sample] = static_cast<int16_t>(chosen);
    dataset_sample_index[sample] = static_cast<int64_t>(tree.taken(chosen));
    tree.take(chosen, sample);
  }
}

void build_exhaustive_blending_indices(const int64_t* sizes, int32_t num_datasets,
                                       int16_t* dataset_index, int64_t* dataset_sample_index) {
  int64_t total = 0;
  for (int32_t dataset = 0; dataset < num_datasets; ++dataset) {
    total += sizes[dataset];
  }
  std::vector<double> weights(num_datasets);
  for (int32_t dataset = 0; dataset < num_datasets; ++dataset) {
    weights[dataset] = static_cast<double>(sizes[dataset]) / static_cast<double>(total);
  }
  if (num_datasets >= kTreeFrom) {  // weights in [0, 1]: the tree's margin holds
    LagTree tree(weights.data(), num_datasets, total);
    for (int64_t sample = 0; sample < total; ++sample) {
      const int32_t chosen = tree.choose(sample);
      dataset_index[sample] = static_cast<int16_t>(chosen);
      dataset_sample_index[sample] = static_cast<int64_t>(tree.taken(chosen));
      tree.take(chosen, sample);
      if (tree.taken(chosen) == static_cast<double>(sizes[chosen])) tree.leave(chosen, sample);
    }
    return;
  }
  // Datasets still drawing, in ascending order so ties go to the lowest id.
  std::vector<int32_t> open(num_datasets);
  for (int32_t dataset = 0; dataset < num_datasets; ++dataset) {
    open[dataset] = dataset;
  }
  std::vector<int64_t> taken(num_datasets, 0);
  for (int64_t sample = 0; !open.empty(); ++sample) {
    const double progress = std::max(static_cast<double>(sample), 1.0);
    size_t chosen_slot = 0;
    double largest = std::numeric_limits<double>::lowest();
    for (size_t slot = 0; slot < open.size(); ++slot) {
      const int32_t dataset = open[slot];
      const double lag = weights[dataset] * progress - static_cast<double>(taken[dataset]);
      if (lag > largest) {
        largest = lag;
        chosen_slot = slot;
      }
    }
    const int32_t chosen = open[chosen_slot];
    dataset_index[sample] = static_cast<int16_t>(chosen);
    dataset_sample_index[sample] = taken[chosen]++;
    if (taken[chosen] == sizes[chosen]) {
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(chosen_slot));
    }
  }
}

}  // namespace megaindex
