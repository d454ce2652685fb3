// The thin Python layer over the builders: megaindex._ext. The Python functions that call these
// (megaindex.helpers) check arguments first and say what is wrong in the caller's terms; this
// layer still refuses, on its own, any array it cannot use as it is, so no caller can make it
// read or write outside an array. Every array argument is `noconvert`: an array of another dtype
// or layout is refused (TypeError), never copied into a temporary that an output would be
// written to and then dropped. Pointers and sizes are read, the GIL is released around the
// plain C++, and problems found in the data surface as IndexError (std::out_of_range).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "atomic_files.hpp"
#include "blending.hpp"
#include "fim.hpp"
#include "gather.hpp"
#include "gpt_tables.hpp"
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
// arrays of a dtype checked at run time, read only
using AnyVector = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnyPairs = nb::ndarray<nb::ro, nb::shape<-1, 2>, nb::c_contig, nb::device::cpu>;

std::string size_text(size_t value) { return std::to_string(value); }

// numpy's name of a dtype, for messages
std::string dtype_name(nb::dlpack::dtype dtype) {
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      return "int" + std::to_string(dtype.bits);
    case nb::dlpack::dtype_code::UInt:
      return "uint" + std::to_string(dtype.bits);
    case nb::dlpack::dtype_code::Float:
      return "float" + std::to_string(dtype.bits);
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      return "dtype code " + std::to_string(dtype.code) + " of " + std::to_string(dtype.bits) +
             " bits";
  }
}

template <typename T>
struct Type {
  using type = T;
};

// Calls visit(Type<T>{}) with the T of Ts that is the dtype of `array`.
template <typename... Ts, typename Array, typename Visit>
void with_dtype(const char* name, const char* expected, const Array& array, Visit&& visit) {
  const nb::dlpack::dtype found = array.dtype();
  const bool matched = ((found == nb::dtype<Ts>() ? (visit(Type<Ts>{}), true) : false) || ...);
  if (!matched) {
    throw nb::type_error((std::string(name) + " must be " + expected + ", got " +
                          dtype_name(found))
                             .c_str());
  }
}

// A numpy array that owns `data`.
template <typename Array, typename T>
Array owned(std::unique_ptr<T[]> data, std::initializer_list<size_t> shape) {
  T* raw = data.release();
  nb::capsule owner(raw, [](void* memory) noexcept { delete[] static_cast<T*>(memory); });
  return Array(raw, shape, owner);
}

// An IndexError naming the document id the walk found outside `sizes`, if it stopped on one.
void check_walk(megaindex::SampleIndexStatus status, const Input<int32_t>& sizes,
                const int32_t* document_index, int64_t bad_position) {
  if (status != megaindex::SampleIndexStatus::kOk) {
    throw nb::index_error(("document_index[" + std::to_string(bad_position) + "] = " +
                           std::to_string(document_index[bad_position]) +
                           " is not a document id: expected 0.." +
                           std::to_string(static_cast<int64_t>(sizes.shape(0)) - 1))
                              .c_str());
  }
}

template <typename T>
nb::ndarray<nb::numpy, T, nb::shape<-1, 2>> sample_index(Input<int32_t> sizes,
                                                     Input<int32_t> document_index,
                                                     int32_t sequence_length, int64_t num_samples,
                                                     int32_t add_extra_token) {
  if (sequence_length < 1 || num_samples < 0 || (add_extra_token != 0 && add_extra_token != 1)) {
    throw nb::value_error(("needs sequence_length >= 1, num_samples >= 0, add_extra_token 0 or "
                           "1; got " +
                           std::to_string(sequence_length) + ", " + std::to_string(num_samples) +
                           ", " + std::to_string(add_extra_token))
                              .c_str());
  }
  if (num_samples > 0 && document_index.shape(0) == 0) {
    throw nb::value_error("document_index is empty");
  }
  const size_t rows = static_cast<size_t>(num_samples) + 1;
  std::unique_ptr<T[]> data(new T[2 * rows]);
  int64_t bad_position = -1;
  megaindex::SampleIndexStatus status;
  {
    nb::gil_scoped_release release;
    status = megaindex::build_sample_index<T>(
        sizes.data(), static_cast<int64_t>(sizes.shape(0)), document_index.data(),
        static_cast<int64_t>(document_index.shape(0)), sequence_length, num_samples,
        add_extra_token, data.get(), &bad_position);
  }
  check_walk(status, sizes, document_index.data(), bad_position);
  return owned<nb::ndarray<nb::numpy, T, nb::shape<-1, 2>>>(std::move(data), {rows, 2});
}

template <typename T>
void fill_sample_index(Input<int32_t> sizes, Input<int32_t> document_index,
                       int32_t sequence_length, int32_t add_extra_token,
                       nb::ndarray<T, nb::shape<-1, 2>, nb::c_contig, nb::device::cpu> out,
                       int64_t first_row, int64_t last_row) {
  const int64_t rows = static_cast<int64_t>(out.shape(0));
  const int64_t documents = static_cast<int64_t>(document_index.shape(0));
  if (sequence_length < 1 || (add_extra_token != 0 && add_extra_token != 1) || first_row < 0 ||
      first_row > last_row || last_row > rows) {
    throw nb::value_error(("needs sequence_length >= 1, add_extra_token 0 or 1 and 0 <= "
                           "first_row <= last_row <= " +
                           std::to_string(rows) + " (out's rows); got " +
                           std::to_string(sequence_length) + ", " +
                           std::to_string(add_extra_token) + ", " + std::to_string(first_row) +
                           ", " + std::to_string(last_row))
                              .c_str());
  }
  if (first_row > 0 && first_row < last_row) {
    const int64_t position = static_cast<int64_t>(out.data()[2 * (first_row - 1)]);
    if (position < 0 || position >= documents) {
      throw nb::index_error(("out[" + std::to_string(first_row - 1) + "] holds position " +
                             std::to_string(position) + ", outside document_index's " +
                             std::to_string(documents) + " entries")
                                .c_str());
    }
  } else if (first_row == 0 && last_row > 1 && documents == 0) {
    throw nb::value_error("document_index is empty");
  }
  int64_t bad_position = -1;
  megaindex::SampleIndexStatus status;
  {
    nb::gil_scoped_release release;
    status = megaindex::fill_sample_index<T>(
        sizes.data(), static_cast<int64_t>(sizes.shape(0)), document_index.data(), documents,
        sequence_length, add_extra_token, out.data(), first_row, last_row, &bad_position);
  }
  check_walk(status, sizes, document_index.data(), bad_position);
}

int64_t sample_count(int32_t num_epochs, int64_t tokens_per_epoch, int32_t sequence_length,
                     bool drop_last_partial_sequence, int32_t add_extra_token) {
  int64_t total = 0;
  if (num_epochs < 1 || tokens_per_epoch < 0 || sequence_length < 1 ||
      (add_extra_token != 0 && add_extra_token != 1) ||
      __builtin_mul_overflow(static_cast<int64_t>(num_epochs), tokens_per_epoch, &total)) {
    throw nb::value_error(("needs num_epochs >= 1, tokens_per_epoch >= 0 (their product an "
                           "int64), sequence_length >= 1, add_extra_token 0 or 1; got " +
                           std::to_string(num_epochs) + ", " + std::to_string(tokens_per_epoch) +
                           ", " + std::to_string(sequence_length) + ", " +
                           std::to_string(add_extra_token))
                              .c_str());
  }
  return megaindex::sample_count(num_epochs, tokens_per_epoch, sequence_length,
                                 drop_last_partial_sequence, add_extra_token);
}

template <typename T>
int legacy_shuffle(Output<uint32_t> key, int pos, Output<T> data) {
  if (key.shape(0) != megaindex::Mt19937::kSize || pos < 0 || pos > megaindex::Mt19937::kSize) {
    throw nb::value_error(("key must hold the 624 words of an MT19937 state and pos be in "
                           "0..624, got " +
                           size_text(key.shape(0)) + " words and pos " + std::to_string(pos))
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

// GPTDataset's three tables of a split in one call; see megaindex.helpers.build_gpt_tables.
nb::tuple gpt_tables(Input<int32_t> sizes, Input<int32_t> documents, int32_t num_epochs,
                     bool separate_final_epoch, uint32_t seed, int32_t sequence_length,
                     int32_t add_extra_token, int64_t num_samples, int64_t samples_first,
                     bool int64_sample_index, bool int64_shuffle_index) {
  const int64_t per_epoch = static_cast<int64_t>(documents.shape(0));
  int64_t entries = 0;
  if (num_epochs < 1 || sequence_length < 1 || (add_extra_token != 0 && add_extra_token != 1) ||
      num_samples < 0 || samples_first < 0 || samples_first > num_samples ||
      __builtin_mul_overflow(per_epoch, static_cast<int64_t>(num_epochs), &entries)) {
    throw nb::value_error(("needs num_epochs >= 1, sequence_length >= 1, add_extra_token 0 or 1 "
                           "and 0 <= samples_first <= num_samples; got " +
                           std::to_string(num_epochs) + ", " + std::to_string(sequence_length) +
                           ", " + std::to_string(add_extra_token) + ", " +
                           std::to_string(samples_first) + ", " + std::to_string(num_samples))
                              .c_str());
  }
  if (num_samples > 0 && per_epoch == 0) {
    throw nb::value_error("documents is empty");
  }
  const megaindex::GptTablesInput input{
      sizes.data(),    static_cast<int64_t>(sizes.shape(0)), documents.data(), per_epoch,
      num_epochs,      separate_final_epoch,                 seed,             sequence_length,
      add_extra_token, num_samples,                          samples_first};
  const size_t rows = static_cast<size_t>(num_samples) + 1;
  std::unique_ptr<int32_t[]> document_index(new int32_t[static_cast<size_t>(entries)]);
  nb::object sample_index;
  nb::object shuffle_index;
  auto build = [&](auto sample_type, auto shuffle_type) {
    using S = typename decltype(sample_type)::type;
    using U = typename decltype(shuffle_type)::type;
    std::unique_ptr<S[]> samples(new S[2 * rows]);
    std::unique_ptr<U[]> order(new U[rows - 1]);
    int64_t bad_position = -1;
    megaindex::SampleIndexStatus status;
    {
      nb::gil_scoped_release release;
      status = megaindex::build_gpt_tables<S, U>(input, document_index.get(), samples.get(),
                                                 order.get(), &bad_position);
    }
    check_walk(status, sizes, document_index.get(), bad_position);
    sample_index = nb::cast(
        owned<nb::ndarray<nb::numpy, S, nb::shape<-1, 2>>>(std::move(samples), {rows, 2}));
    shuffle_index =
        nb::cast(owned<nb::ndarray<nb::numpy, U, nb::ndim<1>>>(std::move(order), {rows - 1}));
  };
  auto with_shuffle = [&](auto sample_type) {
    if (int64_shuffle_index) {
      build(sample_type, Type<int64_t>{});
    } else {
      build(sample_type, Type<uint32_t>{});
    }
  };
  if (int64_sample_index) {
    with_shuffle(Type<int64_t>{});
  } else {
    with_shuffle(Type<int32_t>{});
  }
  auto documents_out = owned<nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>>(
      std::move(document_index), {static_cast<size_t>(entries)});
  return nb::make_tuple(documents_out, sample_index, shuffle_index);
}

void check_blending_outputs(size_t dataset_index, size_t dataset_sample_index, size_t expected) {
  if (dataset_index != expected || dataset_sample_index != expected) {
    throw nb::value_error(("dataset_index and dataset_sample_index must both hold " +
                           size_text(expected) + " entries, got " + size_text(dataset_index) +
                           " and " + size_text(dataset_sample_index))
                              .c_str());
  }
}

void check_dataset_count(size_t count) {
  if (count == 0 || count > 32767) {
    throw nb::value_error(
        ("needs 1..32767 datasets (int16 ids), got " + size_text(count)).c_str());
  }
}

void build_blending_indices(Input<double> weights, Output<int16_t> dataset_index,
                            Output<int64_t> dataset_sample_index) {
  check_dataset_count(weights.shape(0));
  check_blending_outputs(dataset_index.shape(0), dataset_sample_index.shape(0),
                         dataset_index.shape(0));
  nb::gil_scoped_release release;
  megaindex::build_blending_indices(weights.data(), static_cast<int32_t>(weights.shape(0)),
                                    static_cast<int64_t>(dataset_index.shape(0)),
                                    dataset_index.data(), dataset_sample_index.data());
}

void build_exhaustive_blending_indices(Input<int64_t> sizes, Output<int16_t> dataset_index,
                                       Output<int64_t> dataset_sample_index) {
  check_dataset_count(sizes.shape(0));
  // every output entry is written: they must hold sum(sizes), and every size be positive
  int64_t total = 0;
  for (size_t dataset = 0; dataset < sizes.shape(0); ++dataset) {
    const int64_t size = sizes.data()[dataset];
    if (size <= 0 || __builtin_add_overflow(total, size, &total)) {
      throw nb::value_error(("sizes[" + size_text(dataset) + "] = " + std::to_string(size) +
                             ": sizes must be positive and their sum an int64")
                                .c_str());
    }
  }
  check_blending_outputs(dataset_index.shape(0), dataset_sample_index.shape(0),
                         static_cast<size_t>(total));
  nb::gil_scoped_release release;
  megaindex::build_exhaustive_blending_indices(sizes.data(), static_cast<int32_t>(sizes.shape(0)),
                                               dataset_index.data(), dataset_sample_index.data());
}

void fill_document_causal_mask(Input<int64_t> segment_start,
                               nb::ndarray<bool, nb::ndim<2>, nb::c_contig, nb::device::cpu> out,
                               int threads) {
  const size_t length = segment_start.shape(0);
  if (out.shape(0) != length || out.shape(1) != length) {
    throw nb::value_error(("out must have shape (" + size_text(length) + ", " +
                           size_text(length) + ") for " + size_text(length) +
                           " segment starts, got (" + size_text(out.shape(0)) + ", " +
                           size_text(out.shape(1)) + ")")
                              .c_str());
  }
  nb::gil_scoped_release release;
  megaindex::fill_document_causal_mask(segment_start.data(), static_cast<int64_t>(length),
                                       out.data(), threads);
}

int64_t fim_assemble(Input<int64_t> sample, Input<int64_t> inserted,
                     nb::ndarray<const int64_t, nb::shape<-1, 3>, nb::c_contig, nb::device::cpu> runs,
                     Output<int64_t> out, int64_t pad) {
  nb::gil_scoped_release release;
  return megaindex::fim_assemble(sample.data(), static_cast<int64_t>(sample.shape(0)),
                                 inserted.data(), static_cast<int64_t>(inserted.shape(0)),
                                 runs.data(), static_cast<int64_t>(runs.shape(0)), out.data(),
                                 static_cast<int64_t>(out.shape(0)), pad);
}

using Rows = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// GPTDataset's windows of one corpus and one split's tables, bound once: the dtypes are
// dispatched and the sizes checked when it is made, so a batch costs one call with two
// arguments. It keeps the arrays it reads (and so their owners) alive.
class WindowGatherer {
 public:
  WindowGatherer(AnyVector tokens, Input<int64_t> pointers, Input<int32_t> lengths,
                 Input<int32_t> document_index, AnyPairs sample_index, AnyVector shuffle_index,
                 int64_t extra)
      : tokens_(tokens),
        pointers_(pointers),
        lengths_(lengths),
        document_index_(document_index),
        sample_index_(sample_index),
        shuffle_index_(shuffle_index),
        extra_(extra) {
    if (pointers.shape(0) != lengths.shape(0)) {
      throw nb::value_error(("pointers and lengths must hold one entry per sequence, got " +
                             size_text(pointers.shape(0)) + " and " +
                             size_text(lengths.shape(0)))
                                .c_str());
    }
    if (extra != 0 && extra != 1) {
      throw nb::value_error(("extra must be 0 or 1, got " + std::to_string(extra)).c_str());
    }
    with_dtype<uint8_t, int8_t, int16_t, uint16_t, int32_t, int64_t>(
        "tokens", "uint8, int8, int16, uint16, int32 or int64", tokens, [&](auto token) {
          using Token = typename decltype(token)::type;
          with_dtype<int32_t, int64_t>(
              "sample_index", "int32 or int64", sample_index, [&](auto position) {
                using Position = typename decltype(position)::type;
                with_dtype<uint32_t, int64_t>(
                    "shuffle_index", "uint32 or int64", shuffle_index, [&](auto order) {
                      using Order = typename decltype(order)::type;
                      this->template bind<Token, Position, Order>();
                    });
              });
        });
  }

  // Fills row b of `out` with sample samples[b]'s tokens; returns how many each row got.
  std::vector<int64_t> gather(const std::vector<int64_t>& samples, Rows out) const {
    if (out.shape(0) != samples.size()) {
      throw nb::value_error(("out must have a row per sample (" + size_text(samples.size()) +
                             "), got " + size_text(out.shape(0)))
                                .c_str());
    }
    std::vector<int64_t> written(samples.size());
    nb::gil_scoped_release release;
    gather_(samples.data(), static_cast<int64_t>(samples.size()), out.data(),
            static_cast<int64_t>(out.shape(1)), written.data());
    return written;
  }

  // One sample's window into `row` (`width` entries); the count written. No GIL needed.
  int64_t gather_one(int64_t sample, int64_t* row, int64_t width) const {
    int64_t written = 0;
    gather_(&sample, 1, row, width, &written);
    return written;
  }

 private:
  template <typename Token, typename Position, typename Order>
  void bind() {
    const megaindex::WindowTables<Token, Position, Order> tables{
        static_cast<const Token*>(tokens_.data()),
        static_cast<int64_t>(tokens_.shape(0)),
        pointers_.data(),
        lengths_.data(),
        static_cast<int64_t>(lengths_.shape(0)),
        document_index_.data(),
        static_cast<int64_t>(document_index_.shape(0)),
        static_cast<const Position*>(sample_index_.data()),
        static_cast<int64_t>(sample_index_.shape(0)),
        static_cast<const Order*>(shuffle_index_.data()),
        static_cast<int64_t>(shuffle_index_.shape(0))};
    const int64_t extra = extra_;
    gather_ = [tables, extra](const int64_t* samples, int64_t rows, int64_t* out, int64_t width,
                              int64_t* written) {
      megaindex::gather_windows(tables, samples, rows, extra, out, width, written);
    };
  }

  AnyVector tokens_;
  Input<int64_t> pointers_;
  Input<int32_t> lengths_;
  Input<int32_t> document_index_;
  AnyPairs sample_index_;
  AnyVector shuffle_index_;
  int64_t extra_;
  std::function<void(const int64_t*, int64_t, int64_t*, int64_t, int64_t*)> gather_;
};

// A blend's windows: each of its samples is a sample of one part (dataset_index) at a position
// (dataset_sample_index), gathered by that part's WindowGatherer, the whole batch in one call.
// It keeps the parts and the tables it reads alive.
class BlendGatherer {
 public:
  BlendGatherer(nb::list parts, Input<int16_t> dataset_index, Input<int64_t> dataset_sample_index)
      : parts_object_(nb::steal(PySequence_Tuple(parts.ptr()))),
        dataset_index_(dataset_index),
        dataset_sample_index_(dataset_sample_index) {
    if (dataset_index.shape(0) != dataset_sample_index.shape(0)) {
      throw nb::value_error(("dataset_index and dataset_sample_index must have one entry per "
                             "sample, got " +
                             size_text(dataset_index.shape(0)) + " and " +
                             size_text(dataset_sample_index.shape(0)))
                                .c_str());
    }
    for (nb::handle part : parts_object_) {
      if (!nb::isinstance<WindowGatherer>(part)) {  // None included: no null part
        throw nb::type_error(("parts must be WindowGatherers, got " +
                              std::string(nb::str(nb::type_name(part.type())).c_str()))
                                 .c_str());
      }
      parts_.push_back(&nb::cast<const WindowGatherer&>(part));
    }
  }

  // Fills row b of `out` with blend sample indices[b]'s window; returns how many each row got.
  std::vector<int64_t> gather(const std::vector<int64_t>& indices, Rows out) const {
    if (out.shape(0) != indices.size()) {
      throw nb::value_error(("out must have a row per sample (" + size_text(indices.size()) +
                             "), got " + size_text(out.shape(0)))
                                .c_str());
    }
    const int64_t size = static_cast<int64_t>(dataset_index_.shape(0));
    const int64_t width = static_cast<int64_t>(out.shape(1));
    const int64_t parts = static_cast<int64_t>(parts_.size());
    std::vector<int64_t> written(indices.size());
    nb::gil_scoped_release release;
    for (size_t row = 0; row < indices.size(); ++row) {
      const int64_t index = indices[row];
      if (index < 0 || index >= size) {
        throw std::out_of_range("blend sample " + std::to_string(index) + ": outside its " +
                                std::to_string(size) + " samples");
      }
      const int64_t part = dataset_index_.data()[index];
      if (part < 0 || part >= parts) {
        throw std::out_of_range("blend sample " + std::to_string(index) +
                                ": dataset_index holds " + std::to_string(part) +
                                ", not one of the " + std::to_string(parts) + " datasets");
      }
      try {
        written[row] = parts_[part]->gather_one(dataset_sample_index_.data()[index],
                                                out.data() + row * width, width);
      } catch (const std::out_of_range& error) {
        throw std::out_of_range("blend sample " + std::to_string(index) + " (dataset " +
                                std::to_string(part) + "): " + error.what());
      }
    }
    return written;
  }

 private:
  nb::object parts_object_;  // a tuple: the parts stay as they were given
  std::vector<const WindowGatherer*> parts_;
  Input<int16_t> dataset_index_;
  Input<int64_t> dataset_sample_index_;
};

// a write's files as Python hands them: (path, partial, data, identities_of, tail), the paths
// encoded by os.fsencode (a name that is not UTF-8 is written as it is)
// (path, partial, data, corpus (idx path, bin path, header bytes, blocks, block bytes: empty
// paths for none; the files as opened: empty, or each file's size and inode, then the .idx's
// modification time), between,
// identities_of, tail)
using CorpusTuple =
    std::tuple<nb::bytes, nb::bytes, int64_t, int64_t, int64_t, std::vector<uint64_t>>;
using StepTuple = std::tuple<nb::bytes, nb::bytes, nb::object, CorpusTuple, std::string,
                             std::vector<std::pair<std::string, size_t>>, std::string>;

// A file's bytes held by the extension (megaindex.file_writes.held_bytes): a table's header and
// its array copied once into them, then handed to a write without another copy (a 2,400-corpus
// blend of 2M samples writes 403 MB of tables; copying them again from Python bytes, under the
// GIL, was a sixth of its cold build). A write takes them: they are empty once it is queued.
struct FileBytes {
  std::string data;
  bool taken = false;  // by a write: written a second time, they would make an empty file
};

// The bytes a step's `data` names: those of a Python bytes object, copied, or a FileBytes's,
// taken (moved out of it).
std::string step_data(const nb::object& data, const std::string& destination) {
  if (nb::isinstance<nb::bytes>(data)) {
    const nb::bytes bytes = nb::borrow<nb::bytes>(data);
    return std::string(bytes.c_str(), bytes.size());
  }
  if (nb::isinstance<FileBytes>(data)) {
    FileBytes& held = nb::cast<FileBytes&>(data);
    if (held.taken) {
      throw nb::value_error((destination + ": these FileBytes were taken by an earlier write "
                                           "(each is written once)").c_str());
    }
    held.taken = true;
    return std::move(held.data);
  }
  throw nb::type_error((destination + ": a file's data is bytes or FileBytes").c_str());
}

// Where a write that was not queued (`steps`, made of `given` by file_steps) leaves its bytes:
// each FileBytes gets its own back, for the next try.
void give_back(const std::vector<StepTuple>& given, std::vector<FileStep>& steps) {
  for (size_t n = 0; n < given.size(); ++n) {
    const nb::object& data = std::get<2>(given[n]);
    if (nb::isinstance<FileBytes>(data)) {
      FileBytes& held = nb::cast<FileBytes&>(data);
      held.data = std::move(steps[n].data);
      held.taken = false;
    }
  }
}

std::vector<FileStep> file_steps(const std::vector<StepTuple>& given) {
  std::vector<FileStep> steps;
  steps.reserve(given.size());
  for (const auto& [path, partial, data, corpus, between, identities_of, tail] : given) {
    std::string destination(path.c_str(), path.size());
    for (const auto& [key, index] : identities_of) {
      if (index >= steps.size()) {
        throw std::out_of_range(destination + ": the identity of file " +
                                std::to_string(index) + " is asked before it is written");
      }
    }
    const auto& [idx, bin, header_bytes, blocks, block_bytes, opened] = corpus;
    if (idx.size() && (header_bytes < 0 || blocks < 1 || block_bytes < 1)) {
      throw std::invalid_argument(destination + ": a corpus is sampled in blocks of 1 byte or "
                                                "more, at least one, after a header of 0 or more");
    }
    if (!opened.empty() && opened.size() != 5) {
      throw std::invalid_argument(destination + ": a corpus as opened is 5 values (the .idx's "
                                                "size and inode, the .bin's, the .idx's "
                                                "modification time in ns), got " +
                                  std::to_string(opened.size()));
    }
    steps.push_back({destination, std::string(partial.c_str(), partial.size()),
                     step_data(data, destination), std::string(idx.c_str(), idx.size()),
                     std::string(bin.c_str(), bin.size()),
                     megaindex::SampledBlocks{header_bytes, blocks, block_bytes}, opened, between,
                     identities_of, tail});
  }
  return steps;
}

// (identities as [size, mtime_ns, ctime_ns, inode, device] lists, errno (0: none; kTablesRefused:
// the tables' walk refused), failed path, the built tables' checksums as JSON ("": none))
nb::tuple outcome_tuple(const WriteOutcome& outcome) {
  nb::list identities;
  for (const FileIdentity& identity : outcome.identities) {
    nb::list fields;
    fields.append(identity.size);
    fields.append(identity.mtime_ns);
    fields.append(identity.ctime_ns);
    fields.append(identity.inode);
    fields.append(identity.device);
    identities.append(fields);
  }
  return nb::make_tuple(identities, outcome.error,
                        nb::bytes(outcome.failed_path.data(), outcome.failed_path.size()),
                        outcome.checksums);
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "C++ index builders of megaindex (private: use megaindex.helpers)";

  m.def("sample_count", &sample_count, "num_epochs"_a, "tokens_per_epoch"_a, "sequence_length"_a,
        "drop_last_partial_sequence"_a, "add_extra_token"_a,
        "Samples cut from the stream; see megaindex.helpers.sample_count.");
  m.def("build_sample_index_int32", &sample_index<int32_t>, "sizes"_a.noconvert(),
        "document_index"_a.noconvert(), "sequence_length"_a, "num_samples"_a,
        "add_extra_token"_a, "The int32 sample index; see megaindex.helpers.build_sample_idx.");
  m.def("build_sample_index_int64", &sample_index<int64_t>, "sizes"_a.noconvert(),
        "document_index"_a.noconvert(), "sequence_length"_a, "num_samples"_a,
        "add_extra_token"_a, "The int64 sample index; see megaindex.helpers.build_sample_idx.");
  m.def("fill_sample_index", &fill_sample_index<int32_t>, "sizes"_a.noconvert(),
        "document_index"_a.noconvert(), "sequence_length"_a, "add_extra_token"_a,
        "out"_a.noconvert(), "first_row"_a, "last_row"_a,
        "Rows [first_row, last_row) of the sample index in out, resumed from the row before; "
        "see megaindex.helpers.build_sample_idx.");
  m.def("fill_sample_index", &fill_sample_index<int64_t>, "sizes"_a.noconvert(),
        "document_index"_a.noconvert(), "sequence_length"_a, "add_extra_token"_a,
        "out"_a.noconvert(), "first_row"_a, "last_row"_a);
  // one overload per index dtype; without conversion an array picks only its own
  m.def("legacy_shuffle", &legacy_shuffle<int32_t>, "key"_a.noconvert(), "pos"_a,
        "data"_a.noconvert(),
        "Shuffle data from the MT19937 state (key, pos), updating key; returns the new pos. "
        "See megaindex.helpers.shuffle.");
  m.def("legacy_shuffle", &legacy_shuffle<uint32_t>, "key"_a.noconvert(), "pos"_a,
        "data"_a.noconvert());
  m.def("legacy_shuffle", &legacy_shuffle<int64_t>, "key"_a.noconvert(), "pos"_a,
        "data"_a.noconvert());
  m.def("build_gpt_tables", &gpt_tables, "sizes"_a.noconvert(), "documents"_a.noconvert(),
        "num_epochs"_a, "separate_final_epoch"_a, "seed"_a, "sequence_length"_a,
        "add_extra_token"_a, "num_samples"_a, "samples_first"_a, "int64_sample_index"_a,
        "int64_shuffle_index"_a,
        "GPTDataset's document, sample and shuffle index of a split, drawn from "
        "RandomState(seed); see megaindex.helpers.build_gpt_tables.");
  m.def("build_blending_indices", &build_blending_indices, "weights"_a.noconvert(),
        "dataset_index"_a.noconvert(), "dataset_sample_index"_a.noconvert(),
        "See megaindex.helpers.build_blending_indices.");
  m.def("build_exhaustive_blending_indices", &build_exhaustive_blending_indices,
        "sizes"_a.noconvert(), "dataset_index"_a.noconvert(),
        "dataset_sample_index"_a.noconvert(),
        "See megaindex.helpers.build_exhaustive_blending_indices.");
  m.def("fill_document_causal_mask", &fill_document_causal_mask, "segment_start"_a.noconvert(),
        "out"_a.noconvert(), "threads"_a, "See megaindex.helpers.fill_document_causal_mask.");
  m.def("fim_assemble", &fim_assemble, "sample"_a.noconvert(), "inserted"_a.noconvert(),
        "runs"_a.noconvert(), "out"_a.noconvert(), "pad"_a,
        "Lay out a rearranged FIM sample; see megaindex.helpers.fim_assemble.");
  m.def(
      "write_files",
      [](const std::vector<StepTuple>& given) {
        std::vector<FileStep> steps = file_steps(given);
        WriteOutcome outcome;
        {
          nb::gil_scoped_release released;
          outcome = write_files(steps);
        }
        return outcome_tuple(outcome);
      },
      "steps"_a, "Write files atomically, one after the other; see megaindex.file_writes.");
  nb::class_<PendingWrite>(m, "PendingWrite", "A write submitted to a FileWriterPool.")
      .def(
          "wait",
          [](PendingWrite& pending, double seconds) -> std::optional<nb::tuple> {
            const WriteOutcome* outcome;
            {
              nb::gil_scoped_release released;
              outcome = pending.wait_for(seconds);
            }
            if (outcome == nullptr) return std::nullopt;
            return outcome_tuple(*outcome);
          },
          "seconds"_a,
          "The outcome once written, waiting at most seconds: (identities, errno, failed "
          "path, checksums), or None while unfinished.");
  nb::class_<FileBytes>(m, "FileBytes",
                        "A file's bytes held by the extension; see "
                        "megaindex.file_writes.held_bytes.")
      .def_static(
          "join",
          [](nb::bytes head, nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig,
                                         nb::device::cpu> body) {
            FileBytes joined;
            joined.data.reserve(head.size() + body.size());
            joined.data.append(head.c_str(), head.size());
            // with the GIL held: a blend's tables are mostly a few KB, and a thread that takes
            // the GIL meanwhile (a sampler, a logger) holds the build up for longer than the copy
            if (body.size()) {
              joined.data.append(reinterpret_cast<const char*>(body.data()), body.size());
            }
            return joined;
          },
          "head"_a, "body"_a.noconvert(), "head's bytes, then body's (a 1-D uint8 array).")
      .def("__bytes__",
           [](const FileBytes& bytes) { return nb::bytes(bytes.data.data(), bytes.data.size()); });
  nb::class_<FileWriterPool>(m, "FileWriterPool",
                             "Threads writing files atomically; see megaindex.file_writes.")
      .def(nb::init<size_t, size_t>(), "threads"_a, "max_queued_bytes"_a)
      .def(
          "submit",
          [](FileWriterPool& pool, const std::vector<StepTuple>& given,
             double seconds) -> std::optional<std::shared_ptr<PendingWrite>> {
            std::vector<FileStep> steps = file_steps(given);
            std::shared_ptr<PendingWrite> pending;
            {
              nb::gil_scoped_release released;  // waits while the queue is full
              pending = pool.submit(steps, seconds);
            }
            if (!pending) {  // not queued: the steps are as they were made
              give_back(given, steps);
              return std::nullopt;
            }
            return pending;
          },
          "steps"_a, "seconds"_a,
          "Queue a write, waiting at most seconds while too many bytes wait: its "
          "PendingWrite, or None when it was not queued.")
      .def(
          "submit_tables",
          [](FileWriterPool& pool, const std::vector<StepTuple>& given, double seconds,
             Input<int32_t> sizes, Input<int32_t> documents, int32_t num_epochs,
             bool separate_final_epoch, uint32_t seed, int32_t sequence_length,
             int32_t add_extra_token, int64_t num_samples, int64_t samples_first,
             bool int64_sample_index, bool int64_shuffle_index,
             size_t table_bytes) -> std::optional<std::shared_ptr<PendingWrite>> {
            int64_t entries = 0;
            if (num_epochs < 1 || sequence_length < 1 ||
                (add_extra_token != 0 && add_extra_token != 1) || num_samples < 0 ||
                samples_first < 0 || samples_first > num_samples ||
                (num_samples > 0 && documents.shape(0) == 0) ||
                __builtin_mul_overflow(static_cast<int64_t>(documents.shape(0)),
                                       static_cast<int64_t>(num_epochs), &entries)) {
              throw nb::value_error("submit_tables: the tables' inputs are out of range");
            }
            std::vector<FileStep> steps = file_steps(given);
            TablesJob job;
            job.sizes.assign(sizes.data(), sizes.data() + sizes.shape(0));
            job.documents.assign(documents.data(), documents.data() + documents.shape(0));
            job.num_epochs = num_epochs;
            job.separate_final_epoch = separate_final_epoch;
            job.seed = seed;
            job.sequence_length = sequence_length;
            job.add_extra_token = add_extra_token;
            job.num_samples = num_samples;
            job.samples_first = samples_first;
            job.int64_sample_index = int64_sample_index;
            job.int64_shuffle_index = int64_shuffle_index;
            std::shared_ptr<PendingWrite> pending;
            {
              nb::gil_scoped_release released;  // waits while the queue is full
              pending = pool.submit(steps, seconds, std::move(job), table_bytes);
            }
            if (!pending) {
              give_back(given, steps);
              return std::nullopt;
            }
            return pending;
          },
          "steps"_a, "seconds"_a, "sizes"_a.noconvert(), "documents"_a.noconvert(),
          "num_epochs"_a, "separate_final_epoch"_a, "seed"_a, "sequence_length"_a,
          "add_extra_token"_a, "num_samples"_a, "samples_first"_a, "int64_sample_index"_a,
          "int64_shuffle_index"_a, "table_bytes"_a,
          "As submit, for a write whose first three files are GPTDataset's tables of a small "
          "split, built by the writer thread from these inputs (see "
          "megaindex.helpers.build_gpt_tables) after their .npy headers, and whose fourth (the "
          "sidecar) takes their checksums; table_bytes counts among the bytes waiting.")
      .def(
          "close",
          [](FileWriterPool& pool) {
            nb::gil_scoped_release released;
            pool.close();
          },
          "Finish what was submitted and stop the threads.");
  nb::class_<WindowGatherer>(m, "WindowGatherer",
                             "GPT windows of one corpus and one split's tables; see "
                             "megaindex.helpers.WindowGatherer.")
      .def(nb::init<AnyVector, Input<int64_t>, Input<int32_t>, Input<int32_t>, AnyPairs,
                    AnyVector, int64_t>(),
           "tokens"_a.noconvert(), "pointers"_a.noconvert(), "lengths"_a.noconvert(),
           "document_index"_a.noconvert(), "sample_index"_a.noconvert(),
           "shuffle_index"_a.noconvert(), "extra"_a)
      .def("gather", &WindowGatherer::gather, "samples"_a, "out"_a.noconvert(),
           "Tokens written per row.");
  nb::class_<BlendGatherer>(m, "BlendGatherer",
                            "A blend's windows through its parts' WindowGatherers; see "
                            "megaindex.helpers.BlendGatherer.")
      .def(nb::init<nb::list, Input<int16_t>, Input<int64_t>>(), "parts"_a,
           "dataset_index"_a.noconvert(), "dataset_sample_index"_a.noconvert())
      .def("gather", &BlendGatherer::gather, "indices"_a, "out"_a.noconvert(),
           "Tokens written per row.");
}
