// PyTorch's CUDA caching allocator policy without CUDA (see caching_allocator.h).
//
// Every rule below is re-expressed from c10/cuda/CUDACachingAllocator.cpp
// (DeviceCachingAllocator) and c10/core/AllocatorConfig.{h,cpp}; the comment beside each
// rule names the function it comes from. No PyTorch code is copied.
//
// Data structures. PyTorch keeps free blocks of each pool in a std::set ordered by
// (stream, size, address) and the unmapped tails of expandable segments in a set ordered
// by (stream, address). We keep the same two orders in Boost intrusive red-black trees
// whose hooks live inside the blocks, so the reuse path allocates nothing: blocks come
// from a free-list arena, the address -> active block map is open addressing. Iteration
// order, lower_bound and erase behave exactly like PyTorch's std::set.
//
// Invariants: a block is in exactly one of {pool.blocks (mapped, free, no pending events),
// pool.unmapped (expandable, not mapped), the active map (allocated), the event queues
// (freed, waiting on events)}; blocks of one segment form a doubly linked list by address;
// reserved_bytes equals PyTorch's total_allocated_memory.
#include "shardscope/sim/models/caching_allocator.h"

#include <boost/intrusive/set.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <deque>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include <fmt/format.h>

namespace shardscope::sim {
namespace {

// Policy constants: c10/cuda/CUDACachingAllocator.cpp (top of file) and
// c10/core/AllocatorConfig.{h,cpp}.
constexpr int64_t kMinBlockSize = 512;         // every size rounds to a multiple of this
constexpr int64_t kSmallSize = 1 * kMiB;       // largest request served by the small pool
constexpr int64_t kSmallBuffer = 2 * kMiB;     // small-pool segment; small expandable page
constexpr int64_t kMinLargeAlloc = 10 * kMiB;  // requests below this get a kLargeBuffer
constexpr int64_t kLargeBuffer = 20 * kMiB;    // large segment; large expandable page
constexpr int64_t kRoundLarge = 2 * kMiB;      // larger segments round up to this
constexpr int kRoundUpPowerOfTwoIntervals = 16;  // AllocatorConfig.cpp: 1 MiB .. 64 GiB
constexpr int kRoundUpPowerOfTwoStartLog2 = 20;  // the first interval starts at 1 MiB
constexpr int64_t kMaxRegisterThreads = 128;     // CUDAAllocatorConfig pinned_max_register_threads
// "Unlimited" max_split_size (PyTorch: numeric_limits<size_t>::max()).
constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// MakeCapacityDeviceMemory's address space: where cudaMalloc-like addresses start, their
// alignment, and how much virtual space they may spread over.
constexpr uint64_t kDeviceAddressBase = uint64_t{1} << 32;
constexpr int64_t kSegmentAlignment = 2 * kMiB;
constexpr int64_t kDeviceAddressSpan = int64_t{1} << 45;
// Expandable segments reserve their virtual ranges from here (cuMemAddressReserve),
// above anything MakeCapacityDeviceMemory hands out.
constexpr uint64_t kExpandableAddressBase = uint64_t{1} << 46;

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// ---------------------------------------------------------------------------------------
// PYTORCH_CUDA_ALLOC_CONF parsing (c10/core/AllocatorConfig.cpp parseArgs and helpers).

// Tokens: keys and values, and each of , : [ ] on its own; whitespace dropped
// (ConfigTokenizer / lexArgs).
std::vector<std::string> Tokenize(std::string_view conf) {
  std::vector<std::string> tokens;
  std::string buffer;
  for (char ch : conf) {
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (!buffer.empty()) tokens.push_back(std::move(buffer));
      buffer.clear();
      tokens.emplace_back(1, ch);
    } else if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
      buffer += ch;
    }
  }
  if (!buffer.empty()) tokens.push_back(std::move(buffer));
  return tokens;
}

Status ConfError(std::string_view key, std::string_view what) {
  return Status::InvalidInput(fmt::format("PYTORCH_CUDA_ALLOC_CONF: {}: {}", key, what));
}

class ConfParser {
 public:
  explicit ConfParser(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  bool AtEnd() const { return i_ >= tokens_.size(); }
  const std::string& Current() const { return tokens_[i_]; }
  void Advance() { ++i_; }

  // Expects `token` next (consumeToken).
  Status Expect(std::string_view key, std::string_view token) {
    if (AtEnd() || tokens_[i_] != token) {
      return ConfError(key, fmt::format("expected '{}', got {}", token, Describe()));
    }
    ++i_;
    return Status::Ok();
  }

  // The value token after "key:".
  StatusOr<std::string> Value(std::string_view key, std::string_view expected) {
    SHARDSCOPE_RETURN_IF_ERROR(Expect(key, ":"));
    if (AtEnd() || IsPunctuation(tokens_[i_])) {
      return ConfError(key, fmt::format("expected {}, got {}", expected, Describe()));
    }
    return tokens_[i_++];
  }

  std::string Describe() const {
    return AtEnd() ? std::string("the end of the string") : fmt::format("'{}'", tokens_[i_]);
  }

  static bool IsPunctuation(const std::string& t) {
    return t == "," || t == ":" || t == "[" || t == "]";
  }

 private:
  std::vector<std::string> tokens_;
  size_t i_ = 0;
};

StatusOr<int64_t> ParseInteger(std::string_view key, const std::string& text,
                               std::string_view expected) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    return ConfError(key, fmt::format("expected {}, got '{}'", expected, text));
  }
  return value;
}

StatusOr<bool> ParseBool(std::string_view key, const std::string& text) {
  if (text == "True") return true;
  if (text == "False") return false;
  return ConfError(key, fmt::format("expected True or False, got '{}'", text));
}

// max_split_size_mb / max_non_split_rounding_mb: whole MiB, at least kLargeBuffer / 1 MiB
// (parseMaxSplitSize, parseMaxNonSplitRoundingSize), clamped so the bytes fit.
StatusOr<int64_t> ParseMiBAtLeastLargeBuffer(ConfParser& parser, std::string_view key) {
  constexpr std::string_view kExpected = "an integer number of MiB >= 20";
  SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, kExpected));
  SHARDSCOPE_ASSIGN_OR_RETURN(int64_t mib, ParseInteger(key, text, kExpected));
  if (mib < kLargeBuffer / kMiB) {
    return ConfError(key, fmt::format("too small: must be >= {} (MiB), got {}",
                                      kLargeBuffer / kMiB, mib));
  }
  mib = std::min(mib, (kUnlimited - 1) / kMiB);
  return mib * kMiB;
}

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// roundup_power2_divisions: a single power of two for every interval, or a list
// "[64:8,256:4,>:1]" of <interval in MiB (a power of two)>:<divisions (0 or a power of
// two)> (parseRoundUpPower2Divisions). The first entry also fills every lower interval; ">"
// fills from the last named interval (inclusive: PyTorch overwrites it) to the end.
Status ParseRoundupDivisions(ConfParser& parser, std::vector<int64_t>& divisions) {
  constexpr std::string_view kKey = "roundup_power2_divisions";
  divisions.assign(kRoundUpPowerOfTwoIntervals, 0);
  SHARDSCOPE_RETURN_IF_ERROR(parser.Expect(kKey, ":"));
  if (parser.AtEnd()) {
    return ConfError(kKey, "expected a power of two or a list [<MiB>:<divisions>,...], got "
                           "the end of the string");
  }
  if (parser.Current() != "[") {
    const std::string text = parser.Current();
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t value,
                                ParseInteger(kKey, text, "a power of two (divisions)"));
    if (!IsPowerOfTwo(value)) {
      return ConfError(kKey, fmt::format("divisions must be a power of two, got {}", value));
    }
    divisions.assign(kRoundUpPowerOfTwoIntervals, value);
    parser.Advance();
    return Status::Ok();
  }
  parser.Advance();  // '['
  bool first_value = true;
  size_t last_index = 0;
  while (!parser.AtEnd() && parser.Current() != "]") {
    const std::string interval = parser.Current();
    parser.Advance();
    SHARDSCOPE_ASSIGN_OR_RETURN(std::string text,
                                parser.Value(kKey, "a number of divisions"));
    SHARDSCOPE_ASSIGN_OR_RETURN(int64_t value,
                                ParseInteger(kKey, text, "a number of divisions"));
    if (value != 0 && !IsPowerOfTwo(value)) {
      return ConfError(kKey, fmt::format("divisions for '{}' must be 0 or a power of two, "
                                         "got {}", interval, value));
    }
    if (interval == ">") {
      std::fill(divisions.begin() + static_cast<std::ptrdiff_t>(last_index),
                divisions.end(), value);
    } else {
      SHARDSCOPE_ASSIGN_OR_RETURN(
          int64_t mib, ParseInteger(kKey, interval, "an interval in MiB (a power of two) or '>'"));
      if (!IsPowerOfTwo(mib)) {
        return ConfError(kKey, fmt::format("interval must be a power of two (MiB), got {}",
                                           mib));
      }
      size_t index = static_cast<size_t>(std::bit_width(static_cast<uint64_t>(mib)) - 1);
      index = std::min(index, static_cast<size_t>(kRoundUpPowerOfTwoIntervals - 1));
      if (first_value) {
        std::fill(divisions.begin(), divisions.begin() + static_cast<std::ptrdiff_t>(index),
                  value);
        first_value = false;
      }
      divisions[index] = value;
      last_index = index;
    }
    if (!parser.AtEnd() && parser.Current() == ",") {
      parser.Advance();
    } else if (parser.AtEnd() || parser.Current() != "]") {
      return ConfError(kKey, fmt::format("expected ',' or ']', got {}", parser.Describe()));
    }
  }
  if (parser.AtEnd()) return ConfError(kKey, "expected ']', got the end of the string");
  parser.Advance();  // ']'
  return Status::Ok();
}

}  // namespace

StatusOr<AllocatorConfig> AllocatorConfig::Parse(std::string_view conf) {
  AllocatorConfig config;
  ConfParser parser(Tokenize(conf));
  while (!parser.AtEnd()) {
    const std::string key = parser.Current();
    parser.Advance();
    if (key == "max_split_size_mb") {
      SHARDSCOPE_ASSIGN_OR_RETURN(config.max_split_size, ParseMiBAtLeastLargeBuffer(parser, key));
    } else if (key == "max_non_split_rounding_mb") {
      SHARDSCOPE_ASSIGN_OR_RETURN(config.max_non_split_rounding,
                                  ParseMiBAtLeastLargeBuffer(parser, key));
    } else if (key == "garbage_collection_threshold") {
      // parseGarbageCollectionThreshold: a fraction strictly inside (0, 1).
      constexpr std::string_view kExpected = "a number in (0.0, 1.0)";
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, kExpected));
      double value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || !(value > 0.0) ||
          !(value < 1.0)) {
        return ConfError(key, fmt::format("expected {}, got '{}'", kExpected, text));
      }
      config.garbage_collection_threshold = value;
    } else if (key == "roundup_power2_divisions") {
      SHARDSCOPE_RETURN_IF_ERROR(ParseRoundupDivisions(parser, config.roundup_power2_divisions));
    } else if (key == "expandable_segments") {
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, "True or False"));
      SHARDSCOPE_ASSIGN_OR_RETURN(config.expandable_segments, ParseBool(key, text));
    } else if (key == "backend") {
      // parseAllocatorConfig: "native" or "cudaMallocAsync"; only the native policy is
      // modelled here.
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, "native"));
      if (text != "native") {
        return ConfError(key, fmt::format("expected native (cudaMallocAsync is not "
                                          "modelled), got '{}'", text));
      }
    } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_use_background_threads") {
      // Threading and host-allocator switches: no effect on device memory.
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, "True or False"));
      SHARDSCOPE_ASSIGN_OR_RETURN(bool ignored, ParseBool(key, text));
      (void)ignored;
    } else if (key == "pinned_num_register_threads") {
      constexpr std::string_view kExpected = "a power of two <= 128";
      SHARDSCOPE_ASSIGN_OR_RETURN(std::string text, parser.Value(key, kExpected));
      SHARDSCOPE_ASSIGN_OR_RETURN(int64_t threads, ParseInteger(key, text, kExpected));
      if (!IsPowerOfTwo(threads) || threads > kMaxRegisterThreads) {
        return ConfError(key, fmt::format("expected {}, got {}", kExpected, threads));
      }
    } else {
      return ConfError(key, "unrecognized option (expected one of max_split_size_mb, "
                            "max_non_split_rounding_mb, garbage_collection_threshold, "
                            "roundup_power2_divisions, expandable_segments, backend, "
                            "release_lock_on_cudamalloc, pinned_use_cuda_host_register, "
                            "pinned_num_register_threads, pinned_use_background_threads)");
    }
    // Entries are separated by ',' (a trailing one is accepted, as in parseArgs).
    if (!parser.AtEnd()) SHARDSCOPE_RETURN_IF_ERROR(parser.Expect(key, ","));
  }
  return config;
}

// ---------------------------------------------------------------------------------------
// A device of fixed capacity.

namespace {

class CapacityDeviceMemory final : public DeviceMemory {
 public:
  explicit CapacityDeviceMemory(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 0)) {
    free_ranges_.emplace(kDeviceAddressBase, kDeviceAddressSpan);
  }

  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (bytes <= 0) return false;
    const int64_t span = RoundUp(bytes, kSegmentAlignment);
    if (used_ + span > capacity_) return false;
    // First fit from the lowest address, like a fresh driver heap: freed ranges come back.
    for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
      if (it->second < span) continue;
      const uint64_t start = it->first;
      const int64_t left = it->second - span;
      free_ranges_.erase(it);
      if (left > 0) free_ranges_.emplace(start + static_cast<uint64_t>(span), left);
      used_ += span;
      *address = start;
      return true;
    }
    return false;
  }

  void Release(uint64_t address, int64_t bytes) override {
    if (bytes <= 0) return;
    int64_t span = RoundUp(bytes, kSegmentAlignment);
    used_ -= span;
    uint64_t start = address;
    // Coalesce with the free neighbours on both sides.
    auto next = free_ranges_.lower_bound(start);
    if (next != free_ranges_.end() && start + static_cast<uint64_t>(span) == next->first) {
      span += next->second;
      next = free_ranges_.erase(next);
    }
    if (next != free_ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + static_cast<uint64_t>(prev->second) == start) {
        start = prev->first;
        span += prev->second;
        free_ranges_.erase(prev);
      }
    }
    free_ranges_.emplace(start, span);
  }

  bool Map(int64_t bytes) override {
    if (bytes <= 0 || used_ + bytes > capacity_) return false;
    used_ += bytes;
    return true;
  }

  void Unmap(int64_t bytes) override { used_ -= std::max<int64_t>(bytes, 0); }

  int64_t Capacity() const override { return capacity_; }

 private:
  int64_t capacity_;
  int64_t used_ = 0;
  std::map<uint64_t, int64_t> free_ranges_;  // start -> length, disjoint, coalesced
};

// cudaMalloc replayed from a recording: the driver's addresses, in the order it gave them.
class RecordedDeviceMemory final : public DeviceMemory {
 public:
  RecordedDeviceMemory(int64_t capacity, int64_t used, std::vector<uint64_t> addresses)
      : capacity_(std::max<int64_t>(capacity, 0)),
        used_(std::max<int64_t>(used, 0)),
        addresses_(std::move(addresses)) {
    uint64_t highest = kDeviceAddressBase;
    for (uint64_t a : addresses_) highest = std::max(highest, a);
    // Past the last recorded segment, whatever its size: a recorded segment is smaller than
    // the span a device could hold (kDeviceAddressSpan).
    const auto alignment = static_cast<uint64_t>(kSegmentAlignment);
    next_synthetic_ = (highest / alignment + 1) * alignment + static_cast<uint64_t>(kDeviceAddressSpan);
  }

  bool Allocate(int64_t bytes, uint64_t* address) override {
    if (bytes <= 0 || bytes > capacity_ - used_) return false;
    if (next_ < addresses_.size()) {
      *address = addresses_[next_++];
    } else {
      *address = next_synthetic_;
      next_synthetic_ += static_cast<uint64_t>(RoundUp(bytes, kSegmentAlignment));
    }
    used_ += bytes;
    return true;
  }
  void Release(uint64_t /*address*/, int64_t bytes) override { used_ -= std::max<int64_t>(bytes, 0); }
  bool Map(int64_t bytes) override {
    if (bytes <= 0 || bytes > capacity_ - used_) return false;
    used_ += bytes;
    return true;
  }
  void Unmap(int64_t bytes) override { used_ -= std::max<int64_t>(bytes, 0); }
  int64_t Capacity() const override { return capacity_; }

 private:
  int64_t capacity_;
  int64_t used_;
  std::vector<uint64_t> addresses_;
  size_t next_ = 0;
  uint64_t next_synthetic_ = 0;
};

}  // namespace

std::unique_ptr<DeviceMemory> MakeCapacityDeviceMemory(int64_t capacity_bytes) {
  return std::make_unique<CapacityDeviceMemory>(capacity_bytes);
}

std::unique_ptr<DeviceMemory> MakeRecordedDeviceMemory(int64_t capacity_bytes, int64_t used_bytes,
                                                       std::vector<uint64_t> addresses) {
  return std::make_unique<RecordedDeviceMemory>(capacity_bytes, used_bytes, std::move(addresses));
}

// ---------------------------------------------------------------------------------------
// The allocator.

namespace {

namespace bi = boost::intrusive;

struct Pool;

// One expandable segment: a virtual range of `num_pages` pages of `page_size`
// (ExpandableSegment). Physical pages are accounted by DeviceMemory::Map/Unmap.
struct ExpandableSegment {
  uint64_t base = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  int64_t size() const { return page_size * num_pages; }
  // Index of the page holding `p` (segmentLeft) and of the first page at or after it
  // (segmentRight).
  int64_t PageLeft(uint64_t p) const { return static_cast<int64_t>(p - base) / page_size; }
  int64_t PageRight(uint64_t p) const {
    return (static_cast<int64_t>(p - base) + page_size - 1) / page_size;
  }
};

using Hook = bi::set_member_hook<bi::link_mode<bi::normal_link>>;

// Block: a range of a segment (CUDACachingAllocator Block).
struct Block {
  Hook hook;  // in pool.blocks or pool.unmapped, never both
  uint64_t ptr = 0;
  int64_t size = 0;
  int64_t requested_size = 0;
  AllocStream stream = 0;
  Pool* pool = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  ExpandableSegment* expandable = nullptr;
  int64_t gc_count_base = 0;
  int32_t event_count = 0;
  bool allocated = false;
  bool mapped = true;
  std::vector<AllocStream> stream_uses;  // record_stream streams, distinct
  Block* free_next = nullptr;            // arena free list

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// BlockComparatorSize: (stream, size, address). Streams compare as integers, as PyTorch
// compares cudaStream_t handles as integers.
struct SizeKey {
  AllocStream stream;
  int64_t size;
  uint64_t ptr;
};
struct SizeOrder {
  static bool Less(AllocStream sa, int64_t za, uint64_t pa, AllocStream sb, int64_t zb,
                   uint64_t pb) {
    if (sa != sb) return sa < sb;
    if (za != zb) return za < zb;
    return pa < pb;
  }
  bool operator()(const Block& a, const Block& b) const {
    return Less(a.stream, a.size, a.ptr, b.stream, b.size, b.ptr);
  }
  bool operator()(const SizeKey& a, const Block& b) const {
    return Less(a.stream, a.size, a.ptr, b.stream, b.size, b.ptr);
  }
  bool operator()(const Block& a, const SizeKey& b) const {
    return Less(a.stream, a.size, a.ptr, b.stream, b.size, b.ptr);
  }
};
// BlockComparatorAddress: (stream, address).
struct AddressKey {
  AllocStream stream;
  uint64_t ptr;
};
struct AddressOrder {
  static bool Less(AllocStream sa, uint64_t pa, AllocStream sb, uint64_t pb) {
    return sa != sb ? sa < sb : pa < pb;
  }
  bool operator()(const Block& a, const Block& b) const {
    return Less(a.stream, a.ptr, b.stream, b.ptr);
  }
  bool operator()(const AddressKey& a, const Block& b) const {
    return Less(a.stream, a.ptr, b.stream, b.ptr);
  }
  bool operator()(const Block& a, const AddressKey& b) const {
    return Less(a.stream, a.ptr, b.stream, b.ptr);
  }
};

using MemberHook = bi::member_hook<Block, Hook, &Block::hook>;
using SizeSet = bi::set<Block, MemberHook, bi::compare<SizeOrder>, bi::constant_time_size<false>>;
using AddressSet =
    bi::set<Block, MemberHook, bi::compare<AddressOrder>, bi::constant_time_size<false>>;

// BlockPool: the free blocks of one pool (small or large).
struct Pool {
  explicit Pool(bool small) : is_small(small) {}
  bool is_small;
  SizeSet blocks;
  AddressSet unmapped;
  int64_t get_free_blocks_call_count = 0;  // garbage collection's clock

  // insert_into_blocks: stamps the block's age for garbage collection.
  void Insert(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    blocks.insert(*block);
  }
  void Erase(Block* block) { blocks.erase(blocks.iterator_to(*block)); }
};

// Blocks are recycled through a free list so that splitting and merging allocate nothing
// in steady state.
class BlockArena {
 public:
  Block* New() {
    if (free_ == nullptr) Grow();
    Block* block = free_;
    free_ = block->free_next;
    block->ptr = 0;
    block->size = 0;
    block->requested_size = 0;
    block->stream = 0;
    block->pool = nullptr;
    block->prev = nullptr;
    block->next = nullptr;
    block->expandable = nullptr;
    block->gc_count_base = 0;
    block->event_count = 0;
    block->allocated = false;
    block->mapped = true;
    block->stream_uses.clear();
    block->free_next = nullptr;
    return block;
  }
  void Delete(Block* block) {
    block->free_next = free_;
    free_ = block;
  }

 private:
  static constexpr size_t kChunk = 256;
  void Grow() {
    chunks_.push_back(std::make_unique<Block[]>(kChunk));
    Block* chunk = chunks_.back().get();
    for (size_t i = 0; i < kChunk; ++i) Delete(&chunk[kChunk - 1 - i]);
  }
  std::vector<std::unique_ptr<Block[]>> chunks_;
  Block* free_ = nullptr;
};

// Address -> allocated block: linear probing with backward-shift deletion (no tombstones,
// no allocation once grown). Address 0 marks an empty slot; no segment starts at 0.
class AddressMap {
 public:
  AddressMap() : slots_(kInitialSlots), mask_(kInitialSlots - 1) {}

  void Insert(uint64_t key, Block* value) {
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    size_t i = Hash(key) & mask_;
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }

  Block* Find(uint64_t key) const {
    if (key == 0) return nullptr;
    for (size_t i = Hash(key) & mask_; slots_[i].key != 0; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
    }
    return nullptr;
  }

  // Removes `key` and returns its block, or nullptr.
  Block* Erase(uint64_t key) {
    if (key == 0) return nullptr;
    size_t i = Hash(key) & mask_;
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
    Block* value = slots_[i].value;
    slots_[i].key = 0;
    --size_;
    // Shift later members of the probe run back so lookups never stop early.
    for (size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const size_t home = Hash(slots_[j].key) & mask_;
      const bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        slots_[j].key = 0;
        i = j;
      }
    }
    return value;
  }

  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const Slot& slot : slots_) {
      if (slot.key != 0) fn(slot.value);
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Block* value = nullptr;
  };
  static constexpr size_t kInitialSlots = 1024;
  static size_t Hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;  // murmur3 finalizer
    key ^= key >> 33;
    return static_cast<size_t>(key);
  }
  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.key != 0) Insert(slot.key, slot.value);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

void Increase(int64_t& current, int64_t& peak, int64_t amount) {
  current += amount;
  peak = std::max(peak, current);
}

// AllocParams.
struct Params {
  int64_t size = 0;  // rounded request
  AllocStream stream = 0;
  Pool* pool = nullptr;
  int64_t alloc_size = 0;  // segment size if a new one is needed
  Block* block = nullptr;
};

}  // namespace

class CachingAllocator::Impl {
 public:
  Impl(AllocatorConfig config, DeviceMemory& memory, StreamEvents& events)
      : config_(std::move(config)), memory_(memory), events_(events) {
    // setMemoryFraction: the limit is a fraction of the device's total memory.
    set_fraction_ = config_.memory_fraction < 1.0;
    allowed_memory_maximum_ = static_cast<int64_t>(
        std::max(0.0, config_.memory_fraction) * static_cast<double>(memory_.Capacity()));
    gc_enabled_ = set_fraction_ && config_.garbage_collection_threshold > 0.0;
  }

  ~Impl() {
    // The arena owns the blocks; unlink them from the intrusive sets first. Device memory
    // is not returned (PyTorch never frees its cache at exit either).
    for (Pool* pool : {&small_, &large_}) {
      pool->blocks.clear();
      pool->unmapped.clear();
    }
  }

  // round_size (+ roundup_power2_next_division, AllocatorConfig::roundup_power2_divisions).
  int64_t RoundSize(int64_t size) const {
    if (size < kMinBlockSize) return kMinBlockSize;
    const int64_t divisions = DivisionsFor(size);
    if (divisions > 1 && size > kMinBlockSize * divisions) {
      return NextPowerOfTwoDivision(size, divisions);
    }
    return RoundUp(size, kMinBlockSize);
  }

  MallocOutcome Malloc(int64_t orig_size, AllocStream stream) {
    MallocOutcome out;
    if (orig_size <= 0) {
      out.ok = orig_size == 0;
      return out;
    }
    const int64_t allocs_before = stats_.num_device_alloc;
    const int64_t frees_before = stats_.num_device_free;
    const int64_t syncs_before = stats_.num_sync_all_streams;
    const int64_t retries_before = stats_.num_alloc_retries;

    // malloc: first reclaim blocks whose cross-stream uses have completed.
    ProcessEvents();
    Params p;
    p.size = RoundSize(orig_size);
    p.stream = stream;
    p.pool = p.size <= kSmallSize ? &small_ : &large_;  // get_pool
    p.alloc_size = AllocationSize(p.size);

    // malloc's chain: cached block; (free-memory callbacks: none registered in a
    // simulation); garbage collection; new segment; release oversize cached blocks and
    // retry; release every cached block (after syncing events) and retry (a "retry").
    bool found = GetFreeBlock(p);
    if (!found) {
      if (gc_enabled_) GarbageCollectCachedBlocks();
      found = AllocBlock(p, /*is_retry=*/false) ||
              (ReleaseAvailableCachedBlocks(p) && AllocBlock(p, /*is_retry=*/false)) ||
              (ReleaseCachedBlocks() && AllocBlock(p, /*is_retry=*/true));
    }
    out.device_allocs = static_cast<int32_t>(stats_.num_device_alloc - allocs_before);
    out.device_frees = static_cast<int32_t>(stats_.num_device_free - frees_before);
    out.synchronized = stats_.num_sync_all_streams != syncs_before;
    out.retried = stats_.num_alloc_retries != retries_before;

    if (!found) {
      // malloc's OOM branch: trace (address field = free device bytes, size = rounded
      // request), count, and report what the message states.
      const int64_t device_free = std::max<int64_t>(0, memory_.Capacity() - reserved());
      Trace("oom", static_cast<uint64_t>(device_free), p.size, stream);
      stats_.num_ooms += 1;
      out.requested_bytes = p.alloc_size;
      out.device_free_bytes = device_free;
      out.largest_free_block = LargestCachedBlock();
      return out;
    }
    Block* block = AllocFoundBlock(p, orig_size, ShouldSplit(p.block, p.size));
    out.ok = true;
    out.address = block->ptr;
    out.block_bytes = block->size;
    return out;
  }

  // free.
  void Free(uint64_t address) {
    Block* block = active_.Erase(address);
    if (block == nullptr) return;
    block->allocated = false;
    stats_.allocation -= 1;
    stats_.allocated_bytes -= block->size;
    Trace("free_requested", block->ptr, block->requested_size, block->stream);
    if (block->size >= config_.max_split_size) stats_.oversize_allocations -= 1;
    if (!block->stream_uses.empty()) {
      InsertEvents(block);  // deferred: returns to the pool once every event completes
    } else {
      FreeBlock(block);
    }
  }

  // recordStream: uses on the allocation stream need no synchronization.
  void RecordStream(uint64_t address, AllocStream stream) {
    Block* block = active_.Find(address);
    if (block == nullptr || stream == block->stream) return;
    auto& uses = block->stream_uses;
    if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  }

  // emptyCache -> release_cached_blocks.
  int32_t EmptyCache() {
    const int64_t frees_before = stats_.num_device_free;
    ReleaseCachedBlocks();
    return static_cast<int32_t>(stats_.num_device_free - frees_before);
  }

  const MemoryStats& stats() const { return stats_; }

  // Restore: the blocks of each segment are linked in address order like split blocks
  // (Block::splice), allocated ones enter the active map, free runs are merged and
  // inserted into their pool (insert_into_blocks), and the statistics are those
  // alloc_block + alloc_found_block + free_block would have left.
  Status Restore(const std::vector<SnapshotSegment>& segments) {
    if (stats_.segment != 0 || !segments_.empty()) {
      return Status::Internal("CachingAllocator::Restore: the allocator already holds segments");
    }
    // Validate everything first so that an error leaves the allocator untouched.
    std::vector<std::pair<uint64_t, size_t>> by_address;
    for (size_t i = 0; i < segments.size(); ++i) {
      const SnapshotSegment& seg = segments[i];
      auto error = [&](std::string_view what) {
        return Status::InvalidInput(fmt::format("initial state: segment {} (address {:#x}): {}", i, seg.address, what));
      };
      if (seg.is_expandable) return error("expandable segments are not modelled in an initial state");
      if (seg.segment_type != "small" && seg.segment_type != "large") {
        return error(fmt::format("segment_type must be small or large, got '{}'", seg.segment_type));
      }
      if (seg.address == 0) return error("address 0");
      if (seg.blocks.empty()) return error("no blocks");
      uint64_t next = seg.address;
      int64_t total = 0;
      for (size_t b = 0; b < seg.blocks.size(); ++b) {
        const SnapshotBlock& block = seg.blocks[b];
        if (block.size <= 0 || block.size > kUnlimited / 4 - total) {
          return error(fmt::format("block {}: size must be positive, got {}", b, block.size));
        }
        if (block.address != next) {
          return error(fmt::format("block {}: address {:#x}, expected {:#x} (blocks tile the segment in order)", b,
                                   block.address, next));
        }
        if (block.state != "active_allocated" && block.state != "inactive") {
          return error(fmt::format("block {}: state '{}' is not modelled in an initial state (expected "
                                   "active_allocated or inactive)", b, block.state));
        }
        if (block.requested_size < 0) return error(fmt::format("block {}: negative requested_size", b));
        next += static_cast<uint64_t>(block.size);
        total += block.size;
      }
      if (total != seg.total_size) {
        return error(fmt::format("blocks add up to {} bytes, total_size is {}", total, seg.total_size));
      }
      if (next < seg.address) return error("the segment wraps around the address space");
      by_address.emplace_back(seg.address, i);
    }
    std::sort(by_address.begin(), by_address.end());
    for (size_t k = 1; k < by_address.size(); ++k) {
      const SnapshotSegment& prev = segments[by_address[k - 1].second];
      if (prev.address + static_cast<uint64_t>(prev.total_size) > by_address[k].first) {
        return Status::InvalidInput(fmt::format("initial state: segments at {:#x} and {:#x} overlap", prev.address,
                                                by_address[k].first));
      }
    }

    for (const SnapshotSegment& seg : segments) {
      Pool* pool = seg.segment_type == "small" ? &small_ : &large_;
      Increase(stats_.segment, stats_.segment_peak, 1);
      Increase(stats_.reserved_bytes, stats_.reserved_bytes_peak, seg.total_size);
      if (seg.total_size >= config_.max_split_size) {
        Increase(stats_.oversize_segments, stats_.oversize_segments_peak, 1);
      }
      Block* prev = nullptr;
      std::vector<Block*> free_blocks;
      for (const SnapshotBlock& info : seg.blocks) {
        const bool allocated = info.state == "active_allocated";
        if (!allocated && prev != nullptr && !prev->allocated) {
          prev->size += info.size;  // adjacent free blocks are one block in PyTorch
          continue;
        }
        Block* block = arena_.New();
        block->ptr = info.address;
        block->size = info.size;
        block->stream = seg.stream;
        block->pool = pool;
        block->allocated = allocated;
        block->prev = prev;
        if (prev != nullptr) prev->next = block;
        prev = block;
        if (allocated) {
          block->requested_size = info.requested_size;
          active_.Insert(block->ptr, block);
          Increase(stats_.allocation, stats_.allocation_peak, 1);
          Increase(stats_.allocated_bytes, stats_.allocated_bytes_peak, block->size);
          Increase(stats_.active, stats_.active_peak, 1);
          Increase(stats_.active_bytes, stats_.active_bytes_peak, block->size);
          Increase(stats_.requested_bytes, stats_.requested_bytes_peak, block->requested_size);
          if (block->size >= config_.max_split_size) {
            Increase(stats_.oversize_allocations, stats_.oversize_allocations_peak, 1);
          }
        } else {
          free_blocks.push_back(block);
        }
      }
      for (Block* block : free_blocks) {
        pool->Insert(block);
        if (block->is_split()) {
          Increase(stats_.inactive_split, stats_.inactive_split_peak, 1);
          Increase(stats_.inactive_split_bytes, stats_.inactive_split_bytes_peak, block->size);
        }
      }
    }
    return Status::Ok();
  }

  void RecordHistory(bool enabled) {
    record_history_ = enabled;
    if (!enabled) history_.clear();  // recordHistory(false) clears the ring buffer
  }
  const std::vector<TraceEntry>& history() const { return history_; }

  // snapshot: one entry per segment (per contiguous mapped range of an expandable
  // segment), sorted by address.
  std::vector<SnapshotSegment> Snapshot() const {
    std::vector<const Block*> all;
    for (const Pool* pool : {&small_, &large_}) {
      for (const Block& b : pool->blocks) all.push_back(&b);
    }
    active_.ForEach([&](const Block* b) { all.push_back(b); });
    std::set<const Block*> pending;
    for (const auto& [stream, queue] : cuda_events_) {
      for (const auto& entry : queue) pending.insert(entry.second);
    }
    all.insert(all.end(), pending.begin(), pending.end());

    std::vector<SnapshotSegment> result;
    for (const Block* head : all) {
      if (head->prev != nullptr && head->prev->mapped) continue;
      SnapshotSegment segment;
      segment.address = head->ptr;
      segment.stream = head->stream;
      segment.segment_type = head->pool->is_small ? "small" : "large";
      segment.is_expandable = head->expandable != nullptr;
      for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
        SnapshotBlock info;
        info.address = b->ptr;
        info.size = b->size;
        info.requested_size = b->requested_size;
        const bool active = b->allocated || b->event_count > 0 || !b->stream_uses.empty();
        info.state = b->allocated ? "active_allocated"
                                  : (active ? "active_pending_free" : "inactive");
        segment.total_size += b->size;
        if (b->allocated) segment.allocated_size += b->size;
        if (active) {
          segment.active_size += b->size;
          segment.requested_size += b->requested_size;
        }
        segment.blocks.push_back(std::move(info));
      }
      result.push_back(std::move(segment));
    }
    std::sort(result.begin(), result.end(),
              [](const SnapshotSegment& a, const SnapshotSegment& b) {
                return a.address < b.address;
              });
    return result;
  }

 private:
  int64_t reserved() const { return stats_.reserved_bytes; }

  // AllocatorConfig::roundup_power2_divisions(size): the interval index is
  // floor(log2(size)) - log2(1 MiB), clamped to the 16 intervals.
  int64_t DivisionsFor(int64_t size) const {
    const auto& table = config_.roundup_power2_divisions;
    if (table.empty()) return 0;
    const int log_size = std::bit_width(static_cast<uint64_t>(size)) - 1;
    const int index = std::clamp(log_size - kRoundUpPowerOfTwoStartLog2, 0,
                                 kRoundUpPowerOfTwoIntervals - 1);
    return static_cast<size_t>(index) < table.size() ? table[static_cast<size_t>(index)] : 0;
  }

  // roundup_power2_next_division: powers of two stay; otherwise the interval
  // [2^k, 2^(k+1)) is cut into `divisions` equal steps and the size rounds up to the next
  // step (a step of 0 bytes means the next power of two).
  static int64_t NextPowerOfTwoDivision(int64_t size, int64_t divisions) {
    const auto usize = static_cast<uint64_t>(size);
    if (std::has_single_bit(usize)) return size;
    const uint64_t floor = std::bit_floor(usize);
    const uint64_t step = floor >> (std::bit_width(static_cast<uint64_t>(divisions)) - 1);
    if (step == 0) return static_cast<int64_t>(floor << 1);
    const uint64_t rounded = usize & ~(step - 1);
    return static_cast<int64_t>(rounded == usize ? usize : rounded + step);
  }

  // get_allocation_size: small requests share a 2 MiB segment, requests below 10 MiB a
  // 20 MiB one, larger ones get their size rounded up to 2 MiB.
  static int64_t AllocationSize(int64_t size) {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return kLargeBuffer;
    return RoundUp(size, kRoundLarge);
  }

  // should_split: small pool or expandable segments keep any remainder of >= 512 B; the
  // large pool splits only requests below max_split_size, leaving more than 1 MiB.
  bool ShouldSplit(const Block* block, int64_t size) const {
    const int64_t remaining = block->size - size;
    if (block->pool->is_small || config_.expandable_segments) {
      return remaining >= kMinBlockSize;
    }
    return size < config_.max_split_size && remaining > kSmallSize;
  }

  // Size a block could grow to in place: itself plus the unmapped range after it
  // (get_free_block's expandable_size).
  static int64_t ExpandableSize(const Block& b) {
    return b.size + (b.next != nullptr && !b.next->mapped ? b.next->size : 0);
  }

  // get_free_block: best fit by (stream, size, address), then the max_split_size rules.
  bool GetFreeBlock(Params& p) {
    Pool& pool = *p.pool;
    if (gc_enabled_) ++pool.get_free_blocks_call_count;  // block-reuse clock for GC
    auto it = pool.blocks.lower_bound(SizeKey{p.stream, p.size, 0}, SizeOrder());
    if (it == pool.blocks.end() || it->stream != p.stream) return false;
    if (it->expandable != nullptr) {
      // Among expandable blocks, prefer one that cannot grow more than a larger block
      // can: walk forward while the next block's grow-to size is smaller.
      auto next = std::next(it);
      while (it->expandable != nullptr && next != pool.blocks.end() &&
             next->stream == p.stream && ExpandableSize(*next) < ExpandableSize(*it)) {
        it = next++;
      }
    }
    // A request below max_split_size never takes an oversize block ...
    if (p.size < config_.max_split_size && it->size >= config_.max_split_size) return false;
    // ... and an oversize request takes one only if it wastes < max_non_split_rounding.
    if (p.size >= config_.max_split_size &&
        it->size - p.size >= config_.max_non_split_rounding) {
      return false;
    }
    p.block = &*it;
    pool.blocks.erase(it);
    return true;
  }

  // alloc_block: a new segment (cudaMalloc) or, with expandable segments, more mapped
  // pages; refused up front when it would pass the memory-fraction limit.
  bool AllocBlock(Params& p, bool is_retry) {
    if (is_retry) stats_.num_alloc_retries += 1;
    if (set_fraction_ && reserved() + p.alloc_size > allowed_memory_maximum_) return false;
    if (config_.expandable_segments) {
      p.block = TryAllocateExpandableBlock(p);
      return p.block != nullptr;
    }
    uint64_t address = 0;
    if (!memory_.Allocate(p.alloc_size, &address)) return false;
    Block* block = arena_.New();
    block->ptr = address;
    block->size = p.alloc_size;
    block->stream = p.stream;
    block->pool = p.pool;
    Increase(stats_.segment, stats_.segment_peak, 1);
    Increase(stats_.reserved_bytes, stats_.reserved_bytes_peak, p.alloc_size);
    if (p.alloc_size >= config_.max_split_size) {
      Increase(stats_.oversize_segments, stats_.oversize_segments_peak, 1);
    }
    stats_.num_device_alloc += 1;
    Trace("segment_alloc", address, p.alloc_size, p.stream);
    p.block = block;
    return true;
  }

  // release_available_cached_blocks (only with max_split_size set): free the smallest
  // single oversize block of this stream that covers the request, or else oversize blocks
  // from the largest down until their total covers it.
  bool ReleaseAvailableCachedBlocks(const Params& p) {
    if (config_.max_split_size == kUnlimited) return false;
    SizeSet& blocks = p.pool->blocks;
    const int64_t key_size = std::max(p.size, config_.max_split_size);
    auto it = blocks.lower_bound(SizeKey{p.stream, key_size, 0}, SizeOrder());
    if (it == blocks.end() || it->stream != p.stream) {
      if (it == blocks.begin()) return false;
      int64_t released = 0;
      --it;  // the largest block of the stream (if any precedes)
      while (released < key_size && it->size >= config_.max_split_size &&
             it->stream == p.stream) {
        Block* current = &*it;
        if (!Releasable(current)) break;
        released += current->size;
        if (it != blocks.begin()) {
          --it;
          ReleaseBlock(current);
        } else {
          ReleaseBlock(current);
          break;
        }
      }
      return released >= key_size;
    }
    if (!Releasable(&*it)) return false;
    ReleaseBlock(&*it);
    return true;
  }

  // PyTorch would cudaFree any block found above; a split or expandable one cannot be
  // cudaFreed (it asserts), so we decline those instead of corrupting the segment.
  static bool Releasable(const Block* b) { return b->expandable == nullptr && !b->is_split(); }

  // release_cached_blocks: wait for every pending event, then free every whole cached
  // segment and unmap every free page of expandable segments.
  bool ReleaseCachedBlocks() {
    SynchronizeAndFreeEvents();
    ReleaseBlocks(large_);
    ReleaseBlocks(small_);
    return true;
  }

  // release_blocks.
  void ReleaseBlocks(Pool& pool) {
    to_unmap_.clear();
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* block = &*it;
      ++it;
      if (block->expandable != nullptr) {
        to_unmap_.push_back(block);  // unmapping edits the set: do it after the walk
      } else if (!block->is_split()) {
        ReleaseBlock(block);
      }
    }
    for (Block* block : to_unmap_) {
      UnmapBlock(block);
      if (!block->is_split() && !block->mapped) ReleaseExpandableSegment(block);
    }
  }

  // release_block: cudaFree a whole cached segment.
  void ReleaseBlock(Block* block) {
    stats_.num_device_free += 1;
    Trace("segment_free", block->ptr, block->size, block->stream);
    memory_.Release(block->ptr, block->size);
    stats_.segment -= 1;
    stats_.reserved_bytes -= block->size;
    if (block->size >= config_.max_split_size) stats_.oversize_segments -= 1;
    block->pool->Erase(block);
    arena_.Delete(block);
  }

  // release_expandable_segment: the whole virtual range is unmapped and free.
  void ReleaseExpandableSegment(Block* block) {
    block->pool->unmapped.erase(block->pool->unmapped.iterator_to(*block));
    ExpandableSegment* segment = block->expandable;
    arena_.Delete(block);
    auto it = std::find_if(segments_.begin(), segments_.end(),
                           [&](const auto& s) { return s.get() == segment; });
    if (it != segments_.end()) segments_.erase(it);
  }

  // garbage_collect_cached_blocks: when reserved memory passes threshold x allowed
  // maximum, free whole large cached segments not reused for longer than average, in
  // rounds, until enough is reclaimed. No event synchronization.
  void GarbageCollectCachedBlocks() {
    const auto gc_threshold = static_cast<int64_t>(config_.garbage_collection_threshold *
                                                   static_cast<double>(allowed_memory_maximum_));
    if (reserved() <= gc_threshold) return;
    const int64_t target = reserved() - gc_threshold;
    int64_t reclaimed = 0;
    auto age = [&](const Block& b) { return large_.get_free_blocks_call_count - b.gc_count_base; };
    int64_t total_age = 0;
    int64_t freeable = 0;
    for (const Block& b : large_.blocks) {
      if (!b.is_split() && b.expandable == nullptr) {
        total_age += age(b);
        ++freeable;
      }
    }
    if (freeable == 0) return;
    bool freed = true;
    while (reclaimed < target && freed && freeable > 0) {
      const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
      freed = false;
      for (auto it = large_.blocks.begin(); it != large_.blocks.end();) {
        Block* block = &*it;
        ++it;
        if (!block->is_split() && block->expandable == nullptr &&
            static_cast<double>(age(*block)) >= age_threshold) {
          freed = true;
          reclaimed += block->size;
          total_age -= age(*block);
          --freeable;
          ReleaseBlock(block);
        }
      }
    }
  }

  // alloc_found_block: split off the remainder if should_split said so, mark allocated,
  // update statistics (inactive_split counts only non-expandable blocks).
  Block* AllocFoundBlock(const Params& p, int64_t orig_size, bool split) {
    Block* block = p.block;
    Pool* pool = p.pool;
    const bool already_split = block->is_split();
    const bool expandable = block->expandable != nullptr;
    if (split) {
      Block* remaining = block;
      block = arena_.New();
      block->ptr = remaining->ptr;
      block->size = p.size;
      block->stream = p.stream;
      block->pool = pool;
      block->expandable = remaining->expandable;
      block->prev = remaining->prev;
      if (block->prev != nullptr) block->prev->next = block;
      block->next = remaining;
      remaining->prev = block;
      remaining->ptr += static_cast<uint64_t>(p.size);
      remaining->size -= p.size;
      pool->Insert(remaining);
      if (!expandable) {
        if (already_split) {
          stats_.inactive_split_bytes -= block->size;  // an inactive split shrinks
        } else {
          Increase(stats_.inactive_split_bytes, stats_.inactive_split_bytes_peak,
                   remaining->size);
          Increase(stats_.inactive_split, stats_.inactive_split_peak, 1);
        }
      }
    } else if (already_split && !expandable) {
      stats_.inactive_split_bytes -= block->size;
      stats_.inactive_split -= 1;
    }
    block->allocated = true;
    block->requested_size = orig_size;
    Trace("alloc", block->ptr, orig_size, block->stream);
    active_.Insert(block->ptr, block);
    Increase(stats_.allocation, stats_.allocation_peak, 1);
    Increase(stats_.allocated_bytes, stats_.allocated_bytes_peak, block->size);
    Increase(stats_.active, stats_.active_peak, 1);
    Increase(stats_.active_bytes, stats_.active_bytes_peak, block->size);
    Increase(stats_.requested_bytes, stats_.requested_bytes_peak, orig_size);
    if (block->size >= config_.max_split_size) {
      Increase(stats_.oversize_allocations, stats_.oversize_allocations_peak, 1);
    }
    return block;
  }

  // free_block: merge with free neighbours of the same segment, return to the pool.
  void FreeBlock(Block* block) {
    Trace("free_completed", block->ptr, block->requested_size, block->stream);
    const int64_t original_size = block->size;
    const int64_t requested = block->requested_size;
    Pool& pool = *block->pool;
    int64_t net_split_blocks = 0;
    int64_t net_split_bytes = 0;
    Block* const candidates[2] = {block->prev, block->next};
    for (Block* candidate : candidates) {
      const int64_t subsumed = TryMergeBlocks(block, candidate);
      if (subsumed > 0) {
        net_split_blocks -= 1;
        net_split_bytes -= subsumed;
      }
    }
    pool.Insert(block);
    if (block->is_split()) {
      net_split_blocks += 1;
      net_split_bytes += block->size;
    }
    if (block->expandable == nullptr) {
      Increase(stats_.inactive_split, stats_.inactive_split_peak, net_split_blocks);
      Increase(stats_.inactive_split_bytes, stats_.inactive_split_bytes_peak, net_split_bytes);
    }
    stats_.active -= 1;
    stats_.active_bytes -= original_size;
    stats_.requested_bytes -= requested;
  }

  // try_merge_blocks: absorb `src` into `dst` when it is free, has no pending events and
  // is mapped alike. Returns the bytes absorbed.
  int64_t TryMergeBlocks(Block* dst, Block* src) {
    if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
        dst->mapped != src->mapped) {
      return 0;
    }
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next != nullptr) dst->next->prev = dst;
    }
    const int64_t subsumed = src->size;
    dst->size += subsumed;
    Pool& pool = *src->pool;
    if (src->mapped) {
      pool.Erase(src);
    } else {
      pool.unmapped.erase(pool.unmapped.iterator_to(*src));
    }
    arena_.Delete(src);
    return subsumed;
  }

  // ---- expandable segments --------------------------------------------------------------

  static bool Allocatable(const Block* b) {
    return b != nullptr && !b->allocated && b->event_count == 0 && b->stream_uses.empty();
  }

  // find_expandable_block: the lowest address, among this (pool, stream)'s segments,
  // where free and unmapped blocks together hold `size`; else a new segment whose virtual
  // range covers 9/8 of the device's memory in pages of 2 MiB (small) / 20 MiB (large).
  Block* FindExpandableBlock(Params& p) {
    Pool& pool = *p.pool;
    for (auto it = pool.unmapped.lower_bound(AddressKey{p.stream, 0}, AddressOrder());
         it != pool.unmapped.end() && it->stream == p.stream; ++it) {
      Block* candidate = &*it;
      if (Allocatable(candidate->prev)) candidate = candidate->prev;
      int64_t bytes = 0;
      for (Block* b = candidate; bytes < p.size && Allocatable(b); b = b->next) bytes += b->size;
      if (bytes >= p.size) return candidate;
    }
    const int64_t page = pool.is_small ? kSmallBuffer : kLargeBuffer;
    const int64_t total = memory_.Capacity();
    auto segment = std::make_unique<ExpandableSegment>();
    segment->base = next_virtual_address_;
    segment->page_size = page;
    segment->num_pages = (total + total / 8 + page - 1) / page;
    next_virtual_address_ +=
        static_cast<uint64_t>(RoundUp(segment->size(), kSegmentAlignment));
    Block* candidate = arena_.New();
    candidate->ptr = segment->base;
    candidate->size = segment->size();
    candidate->stream = p.stream;
    candidate->pool = &pool;
    candidate->mapped = false;
    candidate->expandable = segment.get();
    segments_.push_back(std::move(segment));
    pool.unmapped.insert(*candidate);
    return candidate;
  }

  // map_block: map whole pages covering [ptr, ptr + size) of an unmapped block; the rest
  // of it stays unmapped; merge with free mapped neighbours.
  bool MapBlock(Block* to_map, int64_t size) {
    const ExpandableSegment& segment = *to_map->expandable;
    const int64_t begin = segment.PageLeft(to_map->ptr);
    const int64_t end = segment.PageRight(to_map->ptr + static_cast<uint64_t>(size));
    const int64_t mapped_size = (end - begin) * segment.page_size;
    if (mapped_size == 0 || !memory_.Map(mapped_size)) return false;
    const uint64_t mapped_ptr = to_map->ptr;
    Pool& pool = *to_map->pool;
    pool.unmapped.erase(pool.unmapped.iterator_to(*to_map));
    to_map->mapped = true;
    if (mapped_size < to_map->size) {
      Block* remaining = arena_.New();
      remaining->ptr = to_map->ptr + static_cast<uint64_t>(mapped_size);
      remaining->size = to_map->size - mapped_size;
      remaining->stream = to_map->stream;
      remaining->pool = &pool;
      remaining->mapped = false;
      remaining->expandable = to_map->expandable;
      Splice(remaining, to_map, to_map->next);
      pool.unmapped.insert(*remaining);
      to_map->size = mapped_size;
    }
    TryMergeBlocks(to_map, to_map->prev);
    TryMergeBlocks(to_map, to_map->next);
    pool.Insert(to_map);
    Increase(stats_.reserved_bytes, stats_.reserved_bytes_peak, mapped_size);
    stats_.num_device_alloc += 1;
    Trace("segment_map", mapped_ptr, mapped_size, to_map->stream);
    return true;
  }

  // try_allocate_expandable_block: map pages until the candidate holds the request.
  Block* TryAllocateExpandableBlock(Params& p) {
    Block* candidate = FindExpandableBlock(p);
    if (!candidate->mapped && !MapBlock(candidate, std::min(candidate->size, p.size))) {
      return nullptr;
    }
    while (candidate->size < p.size) {
      // candidate is free and mapped, followed by an unmapped block: map into it, which
      // merges the candidate into that block.
      Block* next = candidate->next;
      if (!MapBlock(next, std::min(p.size - candidate->size, next->size))) return nullptr;
      candidate = next;
    }
    p.pool->Erase(candidate);
    return candidate;
  }

  // unmap_block: unmap the whole pages inside a free block; the partial pages at either
  // end stay mapped as free blocks of their own.
  void UnmapBlock(Block* block) {
    const ExpandableSegment& segment = *block->expandable;
    const int64_t begin = segment.PageRight(block->ptr);
    const int64_t end = segment.PageLeft(block->ptr + static_cast<uint64_t>(block->size));
    if (begin >= end) return;
    const uint64_t unmapped_ptr = segment.base + static_cast<uint64_t>(begin * segment.page_size);
    const int64_t unmapped_size = (end - begin) * segment.page_size;
    memory_.Unmap(unmapped_size);
    Pool& pool = *block->pool;
    pool.Erase(block);
    const auto before_size = static_cast<int64_t>(unmapped_ptr - block->ptr);
    if (before_size > 0) {
      Block* before = arena_.New();
      before->ptr = block->ptr;
      before->size = before_size;
      before->stream = block->stream;
      before->pool = &pool;
      before->expandable = block->expandable;
      Splice(before, block->prev, block);
      pool.Insert(before);
    }
    const int64_t after_size = block->size - (before_size + unmapped_size);
    if (after_size > 0) {
      Block* after = arena_.New();
      after->ptr = unmapped_ptr + static_cast<uint64_t>(unmapped_size);
      after->size = after_size;
      after->stream = block->stream;
      after->pool = &pool;
      after->expandable = block->expandable;
      Splice(after, block, block->next);
      pool.Insert(after);
    }
    block->ptr = unmapped_ptr;
    block->size = unmapped_size;
    block->mapped = false;
    TryMergeBlocks(block, block->prev);
    TryMergeBlocks(block, block->next);
    pool.unmapped.insert(*block);
    stats_.reserved_bytes -= unmapped_size;
    stats_.num_device_free += 1;
    Trace("segment_unmap", unmapped_ptr, unmapped_size, block->stream);
  }

  // Block::splice: link `block` between `before` and `after`.
  static void Splice(Block* block, Block* before, Block* after) {
    if (before != nullptr) before->next = block;
    block->prev = before;
    if (after != nullptr) after->prev = block;
    block->next = after;
  }

  // ---- record_stream events -------------------------------------------------------------

  // insert_events: one event per stream that used the block.
  void InsertEvents(Block* block) {
    for (AllocStream stream : block->stream_uses) {
      const EventToken event = events_.Record(stream);
      block->event_count += 1;
      cuda_events_[stream].emplace_back(event, block);
      ++pending_events_;
    }
    block->stream_uses.clear();
  }

  // process_events: per stream, retire completed events in order, stopping at the first
  // that has not completed; a block returns to its pool when its last event completes.
  void ProcessEvents() {
    if (pending_events_ == 0) return;
    for (auto& [stream, queue] : cuda_events_) {
      while (!queue.empty()) {
        auto [event, block] = queue.front();
        if (!events_.Query(event)) break;
        queue.pop_front();
        --pending_events_;
        if (--block->event_count == 0) FreeBlock(block);
      }
    }
  }

  // synchronize_and_free_events: wait for every outstanding event.
  void SynchronizeAndFreeEvents() {
    stats_.num_sync_all_streams += 1;
    for (auto& [stream, queue] : cuda_events_) {
      for (auto [event, block] : queue) {
        events_.Synchronize(event);
        if (--block->event_count == 0) FreeBlock(block);
      }
      queue.clear();
    }
    pending_events_ = 0;
  }

  // cacheInfo / cache_info_aux: the largest cached free block.
  int64_t LargestCachedBlock() const {
    int64_t largest = 0;
    for (const Pool* pool : {&small_, &large_}) {
      for (const Block& b : pool->blocks) largest = std::max(largest, b.size);
    }
    return largest;
  }

  void Trace(const char* action, uint64_t address, int64_t size, AllocStream stream) {
    if (!record_history_) return;
    TraceEntry entry;
    entry.action = action;
    entry.address = address;
    entry.size = size;
    entry.stream = stream;
    history_.push_back(std::move(entry));
  }

  AllocatorConfig config_;
  DeviceMemory& memory_;
  StreamEvents& events_;
  bool set_fraction_ = false;
  bool gc_enabled_ = false;
  int64_t allowed_memory_maximum_ = 0;

  BlockArena arena_;  // declared before the pools: destroyed after they unlink
  Pool large_{false};
  Pool small_{true};
  AddressMap active_;
  std::map<AllocStream, std::deque<std::pair<EventToken, Block*>>> cuda_events_;
  int64_t pending_events_ = 0;
  std::vector<std::unique_ptr<ExpandableSegment>> segments_;
  uint64_t next_virtual_address_ = kExpandableAddressBase;
  std::vector<Block*> to_unmap_;  // scratch for ReleaseBlocks

  MemoryStats stats_;
  bool record_history_ = false;
  std::vector<TraceEntry> history_;
};

CachingAllocator::CachingAllocator(AllocatorConfig config, DeviceMemory& memory,
                                   StreamEvents& events)
    : impl_(std::make_unique<Impl>(std::move(config), memory, events)) {}
CachingAllocator::~CachingAllocator() = default;

MallocOutcome CachingAllocator::Malloc(int64_t bytes, AllocStream stream) {
  return impl_->Malloc(bytes, stream);
}
void CachingAllocator::Free(uint64_t address) { impl_->Free(address); }
void CachingAllocator::RecordStream(uint64_t address, AllocStream stream) {
  impl_->RecordStream(address, stream);
}
int32_t CachingAllocator::EmptyCache() { return impl_->EmptyCache(); }
Status CachingAllocator::Restore(const std::vector<SnapshotSegment>& segments) {
  return impl_->Restore(segments);
}
const MemoryStats& CachingAllocator::stats() const { return impl_->stats(); }
std::vector<SnapshotSegment> CachingAllocator::Snapshot() const { return impl_->Snapshot(); }
void CachingAllocator::RecordHistory(bool enabled) { impl_->RecordHistory(enabled); }
const std::vector<TraceEntry>& CachingAllocator::history() const { return impl_->history(); }
int64_t CachingAllocator::RoundSize(int64_t bytes) const { return impl_->RoundSize(bytes); }

}  // namespace shardscope::sim
