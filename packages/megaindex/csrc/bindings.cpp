// The thin Python layer over the builders: megaindex._ext. Arguments are checked by the
// Python functions that call these (megaindex.helpers); here pointers are read, the GIL is
// released, and the plain C++ runs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <string>

#include "blending.hpp"
#include "gather.hpp"
#include "masks.hpp"
#include "sample_index.hpp"
#include "shuffle.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <typename T>
using Input = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Output = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<2>> sample_index(Input<int32_t> sizes,
                                                     Input<int32_t> document_index,
                                                     int32_t sequence_length, int64_t num_samples,
                                                     int32_t add_extra_token) {
  const size_t rows = static_cast<size_t>(num_samples) + 1;
  T* data = new T[2 * rows];
  nb::capsule owner(data, [](void* memory) noexcept { delete[] static_cast<T*>(memory); });
  int64_t bad_position = -1;
  megaindex::SampleIndexStatus status;
  {
    nb::gil_scoped_release release;
    status = megaindex::build_sample_index<T>(
        sizes.data(), static_cast<int64_t>(sizes.shape(0)), document_index.data(),
        static_cast<int64_t>(document_index.shape(0)), sequence_length, num_samples,
        add_extra_token, data, &bad_position);
  }
  if (status != megaindex::SampleIndexStatus::kOk) {
    throw nb::index_error(("document_index[" + std::to_string(bad_position) + "] = " +
                           std::to_string(document_index.data()[bad_position]) +
                           " is not a document id: expected 0.." +
                           std::to_string(sizes.shape(0) - 1))
                              .c_str());
  }
  return nb::ndarray<nb::numpy, T, nb::ndim<2>>(data, {rows, 2}, owner);
}

template <typename T>
int legacy_shuffle(Output<uint32_t> key, int pos, Output<T> data) {
  if (key.shape(0) != megaindex::Mt19937::kSize) {
    throw nb::value_error(("key must hold the 624 words of an MT19937 state, got " +
                           std::to_string(key.shape(0)))
                              .c_str());
  }
  megaindex::Mt19937 state;
  {
    nb::gil_scoped_release release;
    std::copy(key.data(), key.data() + megaindex::Mt19937::kSize, state.key);
    state.pos = pos;
    megaindex::legacy_shuffle<T>(state, data.data(), static_cast<int64_t>(data.shape(0)));
    std::copy(state.key, state.key + megaindex::Mt19937::kSize, key.data());
  }
  return state.pos;
}

template <typename T>
void bind_gather_sample(nb::module_& module) {
  module.def(
      "gather_sample",
      [](Input<T> tokens, Input<int64_t> pointers, Input<int32_t> lengths,
         Input<int32_t> document_index, int64_t begin, int64_t begin_offset, int64_t end,
         int64_t end_offset, int64_t extra, Output<int64_t> out) {
        if (pointers.shape(0) != lengths.shape(0)) {
          throw std::invalid_argument("pointers and lengths differ in length");
        }
        return megaindex::gather_sample<T>(
            tokens.data(), static_cast<int64_t>(tokens.shape(0)), pointers.data(),
            lengths.data(), static_cast<int64_t>(lengths.shape(0)), document_index.data(),
            static_cast<int64_t>(document_index.shape(0)), begin, begin_offset, end, end_offset,
            extra, out.data(), static_cast<int64_t>(out.shape(0)));
      },
      // no converting second pass: an array of another dtype must not pick another overload
      "tokens"_a.noconvert(), "pointers"_a.noconvert(), "lengths"_a.noconvert(),
      "document_index"_a.noconvert(), "begin"_a, "begin_offset"_a, "end"_a, "end_offset"_a,
      "extra"_a, "out"_a.noconvert());
}

}  // namespace


NB_MODULE(_ext, m) {
  m.doc() = "C++ index builders of megaindex (private: use megaindex.helpers)";

  bind_gather_sample<uint8_t>(m);
  bind_gather_sample<int8_t>(m);
  bind_gather_sample<int16_t>(m);
  bind_gather_sample<uint16_t>(m);
  bind_gather_sample<int32_t>(m);
  bind_gather_sample<int64_t>(m);

  m.def("sample_count", &megaindex::sample_count, "num_epochs"_a, "tokens_per_epoch"_a,
        "sequence_length"_a, "drop_last_partial_sequence"_a, "add_extra_token"_a);
  m.def("build_sample_index_int32", &sample_index<int32_t>, "sizes"_a, "document_index"_a,
        "sequence_length"_a, "num_samples"_a, "add_extra_token"_a);
  m.def("build_sample_index_int64", &sample_index<int64_t>, "sizes"_a, "document_index"_a,
        "sequence_length"_a, "num_samples"_a, "add_extra_token"_a);
  m.def("legacy_shuffle", &legacy_shuffle<int32_t>, "key"_a, "pos"_a, "data"_a);
  m.def("legacy_shuffle", &legacy_shuffle<uint32_t>, "key"_a, "pos"_a, "data"_a);
  m.def("legacy_shuffle", &legacy_shuffle<int64_t>, "key"_a, "pos"_a, "data"_a);
  m.def(
      "build_blending_indices",
      [](Input<double> weights, Output<int16_t> dataset_index,
         Output<int64_t> dataset_sample_index) {
        nb::gil_scoped_release release;
        megaindex::build_blending_indices(
            weights.data(), static_cast<int32_t>(weights.shape(0)),
            static_cast<int64_t>(dataset_index.shape(0)), dataset_index.data(),
            dataset_sample_index.data());
      },
      "weights"_a, "dataset_index"_a, "dataset_sample_index"_a);
  m.def(
      "build_exhaustive_blending_indices",
      [](Input<int64_t> sizes, Output<int16_t> dataset_index,
         Output<int64_t> dataset_sample_index) {
        nb::gil_scoped_release release;
        megaindex::build_exhaustive_blending_indices(
            sizes.data(), static_cast<int32_t>(sizes.shape(0)), dataset_index.data(),
            dataset_sample_index.data());
      },
      "sizes"_a, "dataset_index"_a, "dataset_sample_index"_a);
  m.def(
      "fill_document_causal_mask",
      [](Input<int64_t> segment_start,
         nb::ndarray<bool, nb::ndim<2>, nb::c_contig, nb::device::cpu> out, int threads) {
        nb::gil_scoped_release release;
        megaindex::fill_document_causal_mask(
            segment_start.data(), static_cast<int64_t>(segment_start.shape(0)), out.data(),
            threads);
      },
      "segment_start"_a, "out"_a, "threads"_a);
}
