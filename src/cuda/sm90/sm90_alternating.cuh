// Alternating tiles: the sm90 kernel's consumer scheme for rows that are copied,
// not expanded (bf16 rows, the flat prefill workspace). Included by
// sm90_attention_kernel.cuh inside namespace smla::cuda::sm90, after the helpers
// it uses (score_tile, mask_scores, ...).
//
// In the score + value scheme the score warpgroup runs every Q K^T and every
// softmax, and the tensor pipe idles through each softmax (docs/PERF.md, the
// session-11 profile). Here the two consumer warpgroups take alternate 64-key
// tiles: "even" runs Q K^T and the softmax of tiles 0, 2, 4 ... from K buffer 0,
// "odd" those of tiles 1, 3, 5 ... from buffer 1, and each keeps half of O
// (even: columns 0-255, odd: 256-511), so each P V is one P from registers and
// the partner's P from shared memory. The row max goes even -> odd -> even each
// pair of tiles, so one warpgroup's softmax runs while the other's MMAs do.
// A token with an odd number of tiles gets one more, all invalid (zero rows,
// flag 0: nothing is read), so every pair has both tiles.
//
// Two buffers hold both tiles of a pair, so each is released in halves (columns
// 0-255 "left", the rest "right") in the order the consumers finish with them:
// buffer 0 left after even's own P V, buffer 1 right after odd's, then buffer 0
// right and buffer 1 left after the partners' P V. The producer refills them in
// that order; FULL and EMPTY are mbarriers per half (FULL: the copies' own
// cp.async arrivals plus a plain arrival that publishes the zero rows and the
// validity flags). Even issues the next pair's Q K^T over the left half of its
// buffer while its last P V of the pair runs, and the right half after it.
//
// The hand-offs between the consumers are mbarriers (HandOff).
#pragma once

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

inline constexpr int kHalves = 2;
inline constexpr int kLeftUnits = kHalfColumns / 64;  // 64-column regions in the left half

// The hand-offs between the consumer warpgroups, once a pair of tiles: mbarriers of
// 128 arrivals (every thread of the sending warpgroup, so each releases its own
// stores), waited on by the other. With named barriers (arrive / sync) here,
// compute-sanitizer racecheck reported the second warpgroup's stores and the
// first's later loads as racing, even across a named barrier both had synced on.
enum HandOff : int {
  kEvenMaxReady = 0,  // even -> odd: even's row max after its tile
  kPairMaxReady = 1,  // odd -> even: the pair's row max
  kEvenPReady = 2,    // even's P, at the pair's max, in shared memory
  kOddPReady = 3,     // odd's P
};
inline constexpr int kHandOffs = 4;

template <int kDim>
struct HalfBarriers {
  std::uint8_t* smem;
  __device__ std::uint32_t full(int buffer, int half) const {
    return smem_address(smem + Sm90Layout<kDim>::kHalfBarriers + 8 * (2 * buffer + half));
  }
  __device__ std::uint32_t empty(int buffer, int half) const {
    return smem_address(smem + Sm90Layout<kDim>::kHalfBarriers + 8 * (4 + 2 * buffer + half));
  }
  __device__ std::uint32_t hand_off(HandOff which) const {
    return smem_address(smem + Sm90Layout<kDim>::kHalfBarriers + 8 * (8 + static_cast<int>(which)));
  }
};

// By thread 0 before the CTA's first barrier.
template <int kDim>
__device__ __forceinline__ void init_half_barriers(std::uint8_t* smem) {
  const HalfBarriers<kDim> barriers{smem};
  for (int buffer = 0; buffer < 2; ++buffer) {
    for (int half = 0; half < kHalves; ++half) {
      mbarrier_init(barriers.full(buffer, half), 2 * 128);  // each producer thread: copies landed, flags stored
      mbarrier_init(barriers.empty(buffer, half), 128);     // each thread of the warpgroup that read it last
    }
  }
  for (int which = 0; which < kHandOffs; ++which) mbarrier_init(barriers.hand_off(static_cast<HandOff>(which)), 128);
}

// The copying producer's addressing of one key source, read from the params once
// per CTA. Resolving each key through the params (constant loads indexed by the
// source, the packing and page-size tests of request_key / resolve_key) took the
// producer's warps more issue time than the copies (ncu, docs/PERF.md), and the
// consumers waited on it. Rows are plain (row_stride apart in a page).
struct CopySource {
  static constexpr std::uint32_t kDividePages = 32;  // page_shift: the page size is no power of two
  const std::int32_t* indices = nullptr;  // this token's row of the index table
  const std::uint8_t* pages = nullptr;
  std::int64_t page_stride = 0;
  std::int64_t row_stride = 0;
  std::uint32_t num_slots = 0;  // <= INT32_MAX
  std::uint32_t page_size = 1;
  std::uint32_t page_shift = 0;  // slot >> page_shift is the page (31: one page holds every slot)

  __device__ static CopySource of(const KvSourceParams& src, int token) {
    CopySource s;
    s.indices = src.indices + static_cast<std::int64_t>(token) * src.stride_indices_t;
    s.pages = src.pages;
    s.page_stride = src.page_stride_bytes;
    s.row_stride = src.row_stride_bytes;
    s.num_slots = static_cast<std::uint32_t>(src.num_slots);
    if (src.page_size >= src.num_slots) {
      s.page_shift = 31;  // the page is 0 for every slot < 2^31
    } else {
      s.page_size = static_cast<std::uint32_t>(src.page_size);
      s.page_shift = (s.page_size & (s.page_size - 1)) == 0 ? __ffs(static_cast<int>(s.page_size)) - 1 : kDividePages;
    }
    return s;
  }
  // The row of an index value, nullptr where it is outside [0, num_slots) (never read).
  __device__ const std::uint8_t* row(std::int32_t index) const {
    const std::uint32_t slot = static_cast<std::uint32_t>(index);
    if (slot >= num_slots) return nullptr;
    const std::uint32_t page = page_shift != kDividePages ? slot >> page_shift : slot / page_size;
    const std::uint32_t entry = page_shift != kDividePages ? slot - (page << page_shift) : slot - page * page_size;
    return pages + static_cast<std::int64_t>(page) * page_stride + static_cast<std::int64_t>(entry) * row_stride;
  }
};

// A copying producer thread's keys of one tile (one per round): the index values
// requested (-1 past the split's end), then the rows they resolve to (nullptr: not attended).
template <int kRounds>
struct TileKeys {
  std::int32_t words[kRounds];
  const std::uint8_t* rows[kRounds];
};

// One half (units [kFirst, kEnd) of every row part: a column range) of K buffer
// `buffer` for a pair of tiles of parity `parity` (the CTA's pairs counted over its
// work items, so the barriers' phases carry on from one item to the next): wait
// for its release in the previous pair (the CTA's first pair waits on the parity
// before the barrier's first phase, which passes at once), copy, arrive
// on FULL when the copies land. Buffer 0 is filled left half first, buffer 1 right
// half first; that first half also carries the buffer's validity flags.
template <class Loader, int kFirst, int kEnd, int kRounds>
__device__ __forceinline__ void fill_half(std::uint8_t* smem, int parity, int buffer, const TileKeys<kRounds>& keys,
                                          int part, int thread, std::uint64_t l2_policy) {
  using Layout = Sm90Layout<Loader::kDim>;
  constexpr int kKeysPerRound = 128 / Loader::kParts;
  constexpr int kHalf = kFirst == 0 ? 0 : 1;
  const HalfBarriers<Loader::kDim> barriers{smem};
  wait_at(half_site(kWaitEmpty, buffer, kHalf), thread, barriers.empty(buffer, kHalf), parity ^ 1);
  std::uint8_t* k_tile = smem + Layout::kK + buffer * Layout::kTileBytes;
  int* valid_s = reinterpret_cast<int*>(smem + Layout::kValid);
  const bool with_flags = buffer == kHalf;
  bool stored_zero_rows = false;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int row = r * kKeysPerRound + Loader::key_of(thread);
    Loader::template copy_async<kFirst, kEnd>(k_tile, row, part, keys.rows[r], l2_policy);
    stored_zero_rows |= keys.rows[r] == nullptr;
    if (with_flags && part == 0) valid_s[buffer * kKeys + row] = keys.rows[r] != nullptr ? 1 : 0;
  }
  const std::uint32_t full = barriers.full(buffer, kHalf);
  cp_async_arrive_when_done(full);
  // Zero rows (generic proxy stores) before the consumers' wgmma reads (async proxy):
  // fenced by their writer, only where there are any (a fence in every fill cost as
  // much as the consumers' fences after each wait, docs/PERF.md, session 23).
  if (stored_zero_rows) fence_view_async_shared();
  mbarrier_arrive(full);  // releases the zero rows and flags stored above
}

// The producer: per pair of tiles, buffer 0 left, buffer 1 right, buffer 0 right,
// buffer 1 left, each once its last reader released it in the previous pair.
// (The sm90 kernel never packs tokens: a key's source follows from its position.)
// first_parity: of the pairs this CTA ran for its earlier work items (their count's).
template <class Loader>
__device__ __forceinline__ void run_alternating_producer(const SparseAttentionParams& p, std::uint8_t* smem, int token,
                                                         int begin, int end, int n_main, int num_pairs,
                                                         int first_parity, int thread) {
  constexpr int kKeysPerRound = 128 / Loader::kParts;
  constexpr int kRounds = kKeys / kKeysPerRound;
  const int part = Loader::part_of(thread);
  auto position_of = [&](int tile, int round) { return begin + tile * kKeys + round * kKeysPerRound + Loader::key_of(thread); };
  const CopySource main_source = CopySource::of(p.source[0], token);
  const CopySource extra_source = p.num_sources > 1 ? CopySource::of(p.source[1], token) : CopySource{};
  // Each tile's indices are requested once its buffer's last half of the previous
  // pair is filled, a pair ahead of their use (requesting both right after the pair's
  // own were resolved measured 1-2% slower, docs/PERF.md). Past `end` (the odd count's
  // extra tile) nothing is read.
  auto request_tile = [&](int tile, TileKeys<kRounds>& keys) {
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int position = position_of(tile, r);
      keys.words[r] = position >= end       ? -1
                      : position < n_main ? __ldg(main_source.indices + position)
                                          : __ldg(extra_source.indices + (position - n_main));
    }
  };
  auto resolve_tile = [&](int tile, TileKeys<kRounds>& keys) {
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      keys.rows[r] = position_of(tile, r) < n_main ? main_source.row(keys.words[r]) : extra_source.row(keys.words[r]);
    }
  };
  const std::uint64_t l2_policy = l2_evict_last_policy();
  TileKeys<kRounds> even;
  TileKeys<kRounds> odd;
  if (thread == 0) trace_item(kItemProducerStart);
  request_tile(0, even);
  request_tile(1, odd);
  for (int pair = 0; pair < num_pairs; ++pair) {
    const int parity = (first_parity + pair) & 1;
    resolve_tile(2 * pair, even);
    if (pair == 0 && thread == 0) trace_item_when_loaded(kItemIndicesIn, static_cast<std::uint32_t>(even.words[0]));
    resolve_tile(2 * pair + 1, odd);
    fill_half<Loader, 0, kLeftUnits>(smem, parity, 0, even, part, thread, l2_policy);
    if (pair == 0 && thread == 0) trace_item(kItemFirstFill);
    fill_half<Loader, kLeftUnits, Loader::kUnitsPerPart>(smem, parity, 1, odd, part, thread, l2_policy);
    fill_half<Loader, kLeftUnits, Loader::kUnitsPerPart>(smem, parity, 0, even, part, thread, l2_policy);
    if (pair == 0 && thread == 0) trace_item(kItemThirdFill);
    request_tile(2 * pair + 2, even);
    fill_half<Loader, 0, kLeftUnits>(smem, parity, 1, odd, part, thread, l2_policy);
    request_tile(2 * pair + 3, odd);
  }
}

// A value of this thread's two rows, published by a quad's lane 0, which then
// releases it by its own arrival (hand-off mbarrier) or barrier; the warp
// reconverges after the stores.
__device__ __forceinline__ void publish_rows(float* to, const float (&value)[2], int row0, int lane) {
  if (lane % 4 == 0) {
    to[row0] = value[0];
    to[row0 + 8] = value[1];
  }
  __syncwarp();
}

// Lazy references. A row's probabilities are taken against a reference that both
// warpgroups keep equal (the row max when it last moved it) and that moves only
// when the row max leaves [reference, reference + kLazyLead / scale_log2]: P is
// then at most 2^kLazyLead, which bf16 P and the f32 sums hold with the same
// relative precision, and O's 128-multiply rescale (and even's second one for the
// pair's max) is skipped by the warp vote on almost every pair, where with the
// exact max it ran on 97% of them (docs/PERF.md, session 19). Both warpgroups
// reach the same reference from the same (reference, max) by the same arithmetic,
// so none is exchanged; the item's end rescales O and the sums to the true max,
// after which the statistics are those of the exact scheme.
inline constexpr float kLazyLead = 8.0f;

__device__ __forceinline__ float lazy_reference(float reference, float row_max, float scale_log2) {
  const float candidate = exp2_reference(row_max);
  const float lead = (candidate - reference) * scale_log2;
  return lead >= 0.0f && lead <= kLazyLead ? reference : candidate;  // NaN leads (inf - inf) move it
}

// The factor taking what was accumulated against `from` to `to`; max_before is the
// row max it was accumulated under (-inf: nothing yet, all zeros, whose factor must
// stay finite however far `to` lies below `from`).
__device__ __forceinline__ float reference_change(float from, float to, float max_before, float scale_log2) {
  if (from == to) return 1.0f;
  return max_before == -INFINITY ? 0.0f : exp2f((from - to) * scale_log2);
}

// One tile's step of a row under lazy references: row_max takes the tile's max,
// the reference follows it only as far as lazy_reference says.
__device__ __forceinline__ void advance_rows_lazily(float (&row_max)[2], float (&reference)[2],
                                                    const float (&tile_max)[2], float scale_log2, float (&alpha)[2],
                                                    float (&row_sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float before = row_max[h];
    row_max[h] = fmaxf(before, tile_max[h]);
    const float next = lazy_reference(reference[h], row_max[h], scale_log2);
    alpha[h] = reference_change(reference[h], next, before, scale_log2);
    reference[h] = next;
    row_sum[h] *= alpha[h];
  }
}

// Issues (does not commit) the 16-value steps [kFirstStep, kEndStep) of S = Q K^T
// once the K half they read has landed; the first step of the tile overwrites S.
template <int kDim, int kFirstStep, int kEndStep>
__device__ __forceinline__ void issue_score_steps(float (&s)[32], std::uint64_t q_desc, std::uint64_t k_desc,
                                                  std::uint32_t full, int parity, bool first, WaitSite site,
                                                  int thread) {
  using Layout = Sm90Layout<kDim>;
  wait_at(site, thread, full, parity);
  wgmma_fence();
#pragma unroll
  for (int step = kFirstStep; step < kEndStep; ++step) {
    const std::uint32_t offset = (step / 4) * Layout::kChunkBytes + (step % 4) * 32;
    wgmma_m64n64k16_ss<0>(s, advance_desc(q_desc, offset), advance_desc(k_desc, offset),
                          first && step == kFirstStep ? 0 : 1);
  }
}

// Whether this launch writes its outputs by tensor stores (only rows of d 512 have the
// slots; the launch encodes the map only for them).
template <int kDim>
__device__ __forceinline__ bool output_by_tensor_stores(const SparseAttentionParams& p) {
  if constexpr (Sm90Layout<kDim>::kHasOutputSlots) {
    return p.out_by_tensor_map;
  } else {
    return false;
  }
}

// Warp `warp` of warpgroup `half`'s 4 KB output slot (Sm90Layout::kOutputSlots).
template <int kDim>
__device__ __forceinline__ std::uint32_t output_slot(std::uint8_t* smem, int half, int warp) {
  using Layout = Sm90Layout<kDim>;
  const int in_p_tile = warp < 2 ? (half == 0 ? Layout::kEvenP : Layout::kP) + warp * Layout::kOutputSlotBytes
                                 : Layout::kOutputSlots + (2 * half + warp - 2) * Layout::kOutputSlotBytes;
  return smem_address(smem + in_p_tile);
}

// Tensor stores of the output (output_by_tensor_stores), a 64-column box at a time, two in
// flight, from shared memory that no wgmma reads any more, so the Q tile is free for
// the next item's Q once the last Q K^T is done. kBoxRows 16: each warp stages and
// stores its own 16 rows from a 4 KB slot of its own (the slot's halves in turn), and
// no warp waits for another. kBoxRows 64 (SparseAttentionParams::out_box_rows): the
// warpgroup's four warps stage a box of its 64 rows, its P tile and its 8 KB of the
// slots after the layout in turn, and its thread 0 stores it after a barrier of the
// warpgroup: 4 stores a warpgroup and item instead of 16, as FlashMLA writes its
// output. By every thread of the warp (16) or warpgroup (64); on return their boxes
// have been read out of shared memory, which the next item writes again.
template <int kDim, int kBoxRows>
__device__ __forceinline__ void write_output_by_tensor_stores(const SparseAttentionParams& p, float (&o)[128],
                                                              std::uint8_t* smem, int token, int head0, int half,
                                                              int warp, int lane) {
  static_assert(kBoxRows == 16 || kBoxRows == 64);
  using Layout = Sm90Layout<kDim>;
  constexpr bool kByWarp = kBoxRows == 16;
  constexpr int kBoxBytes = kBoxRows * kSwizzleRowBytes;
  constexpr int kBoxes = kHalfColumns / 64;
  const RowFactors<kDim> factors(smem, warp, lane);
  const std::uint32_t first =
      kByWarp ? output_slot<kDim>(smem, half, warp) : smem_address(smem + (half == 0 ? Layout::kEvenP : Layout::kP));
  const std::uint32_t buffers[2] = {
      first, kByWarp ? first + kBoxBytes : smem_address(smem + Layout::kOutputSlots + half * Layout::kChunkBytes)};
  const MatrixLane at = matrix_lane(warp, lane);
  const int box_row = kByWarp ? at.row - 16 * warp : at.row;
  const bool storer = lane == 0 && (kByWarp || warp == 0);
  auto sync = [&] {
    if constexpr (kByWarp) {
      __syncwarp();
    } else {
      named_barrier_sync(kOutput0 + half, 128);
    }
  };
#pragma unroll
  for (int box = 0; box < kBoxes; ++box) {
    const std::uint32_t buffer = buffers[box % 2];
    if (box >= 2) {
      if (storer) bulk_wait_older_sources_read<1>();  // the box before last has left this buffer
      sync();
    }
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {  // n-tiles 8 box + 2 pair and + 1
      store_scaled_tile_pair(buffer + swizzled_offset(box_row, 2 * pair + at.unit), o + 8 * (4 * box + pair),
                             factors.value);
    }
    fence_view_async_shared();  // each thread's rows, before the tensor store reads them
    sync();
    if (storer) {
      tensor_store_3d(p.out_tensor_map, buffer, half * kHalfColumns + 64 * box, head0 + (kByWarp ? 16 * warp : 0),
                      token, l2_evict_first_policy());
      bulk_commit();
    }
  }
  if (storer) bulk_wait_sources_read();  // the buffers (P tiles among them) are written again next item
  sync();
}

// One consumer warpgroup of the alternating scheme, one work item. kOdd: tiles 1, 3,
// ... and O columns 256-511. first_parity as for the producer. On return every K
// half is released and both warpgroups are done with the Q tile. query_free() (by
// every even thread) is called once the Q tile may take the next item's Q: after
// the output where it is staged there, else as soon as both warpgroups' last
// Q K^T are done, so the next Q lands under this item's output stores.
template <class Loader, bool kOdd, class QueryFree>
__device__ __forceinline__ void run_alternating_consumer(const SparseAttentionParams& p, std::uint8_t* smem, int token,
                                                         int head0, int split, int num_pairs, int first_parity,
                                                         int thread, QueryFree&& query_free) {
  using Layout = Sm90Layout<Loader::kDim>;
  constexpr int kOwn = kOdd ? 1 : 0;  // this warpgroup's K buffer, and its half of O's columns
  constexpr int kPartner = 1 - kOwn;
  constexpr int kSteps = Loader::kDim / 16;
  constexpr int kLeftSteps = kLeftUnits * 4;  // Q K^T steps over the left half
  const HalfBarriers<Loader::kDim> barriers{smem};
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int row0 = 16 * warp + lane / 4;
  const int* valid_s = reinterpret_cast<const int*>(smem + Layout::kValid) + kOwn * kKeys;
  float* even_max_s = reinterpret_cast<float*>(smem + Layout::kAlpha);   // even's running max after its tile
  float* pair_max_s = reinterpret_cast<float*>(smem + Layout::kRowMax);  // the pair's
  const std::uint32_t own_p = smem_address(smem + (kOdd ? Layout::kP : Layout::kEvenP));
  const std::uint32_t partner_p = smem_address(smem + (kOdd ? Layout::kEvenP : Layout::kP));
  const std::uint32_t own_k = smem_address(smem + Layout::kK + kOwn * Layout::kTileBytes);
  const std::uint32_t partner_k = smem_address(smem + Layout::kK + kPartner * Layout::kTileBytes);
  const std::uint64_t q_desc = make_sw128_desc(smem_address(smem + Layout::kQ), 16, kSwizzleAtomBytes);
  const std::uint64_t k_desc = make_sw128_desc(own_k, 16, kSwizzleAtomBytes);
  // O columns [256 kOwn, 256 kOwn + 256): the same half of both buffers' V.
  const std::uint64_t own_v = value_half_desc<Loader::kDim>(own_k, kOwn);
  const std::uint64_t partner_v = value_half_desc<Loader::kDim>(partner_k, kOwn);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // the same in both warpgroups after every pair
  float reference[2] = {0.0f, 0.0f};          // so is this (lazy_reference); 0: exp2_reference of -inf
  float row_sum[2] = {0.0f, 0.0f};            // of this warpgroup's tiles; the two meet at the end
  // Even's P V of odd's P of the pair before (issued ahead of this pair's Q K^T, so both run together).
  auto issue_partner_pv = [&](int parity) {
    wait_at(kWaitEvenOddP, thread, barriers.hand_off(kOddPReady), parity);
    // Buffer 1's left half landed before odd's Q K^T, and cannot be refilled before
    // even releases it; its copies are seen through its own barrier.
    wait_at(half_site(kWaitEvenFull, 1, 0), thread, barriers.full(1, 0), parity);
    issue_pv_from_shared(o, partner_p, partner_v);
  };

  for (int pair = 0; pair < num_pairs; ++pair) {
    const int parity = (first_parity + pair) & 1;
    float s[32];
    if constexpr (kOdd) {  // the right half lands first
      issue_score_steps<Loader::kDim, kLeftSteps, kSteps>(s, q_desc, k_desc, barriers.full(1, 1), parity, true,
                                                          half_site(kWaitOddFull, 1, 1), thread);
      issue_score_steps<Loader::kDim, 0, kLeftSteps>(s, q_desc, k_desc, barriers.full(1, 0), parity, false,
                                                     half_site(kWaitOddFull, 1, 0), thread);
      wgmma_commit();
    } else if (pair == 0) {
      issue_score_steps<Loader::kDim, 0, kLeftSteps>(s, q_desc, k_desc, barriers.full(0, 0), parity, true,
                                                     half_site(kWaitEvenFull, 0, 0), thread);
      if (thread == 0) trace_item(kItemFirstLeftIn);
      issue_score_steps<Loader::kDim, kLeftSteps, kSteps>(s, q_desc, k_desc, barriers.full(0, 1), parity, false,
                                                          half_site(kWaitEvenFull, 0, 1), thread);
      wgmma_commit();
      if (thread == 0) trace_item(kItemFirstTiles);
    } else {
      // The pair before's last P V, then this pair's Q K^T: the left half (refilled since
      // even's own P V) under that P V, the right half (refilled once odd's P V of the
      // pair before is done) after it.
      issue_partner_pv(parity ^ 1);
      issue_score_steps<Loader::kDim, 0, kLeftSteps>(s, q_desc, k_desc, barriers.full(0, 0), parity, true,
                                                     half_site(kWaitEvenFull, 0, 0), thread);
      wgmma_commit();
      wgmma_wait<1>();
      pin_registers(o);
      mbarrier_arrive(barriers.empty(1, 0));  // buffer 1, left
      issue_score_steps<Loader::kDim, kLeftSteps, kSteps>(s, q_desc, k_desc, barriers.full(0, 1), parity, false,
                                                          half_site(kWaitEvenFull, 0, 1), thread);
      wgmma_commit();
    }
    wgmma_wait<0>();
    pin_registers(s);
    float tile_max[2];
    mask_scores(s, valid_s, lane, tile_max);
    float alpha[2];
    [[maybe_unused]] const float pair_reference[2] = {reference[0], reference[1]};  // the pair before's (even: beta)
    if constexpr (kOdd) {
      wait_at(kWaitOddEvenMax, thread, barriers.hand_off(kEvenMaxReady), parity);
#pragma unroll
      for (int h = 0; h < 2; ++h) tile_max[h] = fmaxf(tile_max[h], even_max_s[row0 + 8 * h]);
    }
    advance_rows_lazily(row_max, reference, tile_max, p.scale_log2, alpha, row_sum);
    if constexpr (kOdd) {
      publish_rows(pair_max_s, row_max, row0, lane);
      mbarrier_arrive(barriers.hand_off(kPairMaxReady));
    } else {
      publish_rows(even_max_s, row_max, row0, lane);
      mbarrier_arrive(barriers.hand_off(kEvenMaxReady));
    }
    rescale_changed_rows(o, alpha[0], alpha[1]);
    exponentiate_scores(s, reference, p.scale_log2, row_sum);
    Probabilities probabilities;
    pack_probabilities(s, probabilities);
    issue_pv_from_registers(o, probabilities, own_v);

    if constexpr (!kOdd) {
      // The pair's max, while that P V runs: P at it goes to odd from the f32
      // weights in s (one rounding), not from the registers the wgmma reads, so
      // odd's P V of it does not wait for even's own to finish (ncu: even waited
      // for its P V here and odd for even's P, each a few percent of the loop).
      wait_at(kWaitEvenPairMax, thread, barriers.hand_off(kPairMaxReady), parity);
      float beta[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The pair's reference as odd reached it: from the pair before's, by the pair's max.
        const float own_max = row_max[h];
        row_max[h] = pair_max_s[row0 + 8 * h];
        const float next = lazy_reference(pair_reference[h], row_max[h], p.scale_log2);
        beta[h] = reference_change(reference[h], next, own_max, p.scale_log2);
        reference[h] = next;
        row_sum[h] *= beta[h];
      }
      if (__any_sync(0xFFFFFFFFu, beta[0] != 1.0f || beta[1] != 1.0f)) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] *= beta[(i % 4) / 2];
      }
      Probabilities pair_probabilities;
      pack_probabilities(s, pair_probabilities);
      store_probabilities(own_p, pair_probabilities, warp, lane);
      fence_view_async_shared();
      mbarrier_arrive(barriers.hand_off(kEvenPReady));
      wgmma_wait<0>();
      pin_registers(o);
      mbarrier_arrive(barriers.empty(0, 0));  // buffer 0, left: even was its last reader
      rescale_changed_rows(o, beta[0], beta[1]);
    } else {
      store_probabilities(own_p, probabilities, warp, lane);
      // Odd's P is all even's P V of it needs (buffer 1's left half it waits on
      // itself): released before odd waits for even's P, so neither waits on a round trip.
      fence_view_async_shared();
      mbarrier_arrive(barriers.hand_off(kOddPReady));
      wait_at(kWaitOddEvenP, thread, barriers.hand_off(kEvenPReady), parity);
      // Buffer 0's right half landed before even's Q K^T, and cannot be refilled before odd releases it.
      wait_at(half_site(kWaitOddFull, 0, 1), thread, barriers.full(0, 1), parity);
      issue_pv_from_shared(o, partner_p, partner_v);
      wgmma_wait<1>();
      mbarrier_arrive(barriers.empty(1, 1));  // buffer 1, right
      wgmma_wait<0>();
      pin_registers(o);
      mbarrier_arrive(barriers.empty(0, 1));  // buffer 0, right
    }
  }

  if constexpr (!kOdd) {
    issue_partner_pv((first_parity + num_pairs - 1) & 1);
    wgmma_wait<0>();
    pin_registers(o);
    mbarrier_arrive(barriers.empty(1, 0));  // buffer 1, left: the next item's first pair may fill it
    if (thread == 0) trace_item(kItemPairsDone);
  }
  // O and the sums from the lazy reference to the true max: the exact scheme's statistics from here on.
  float to_max[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    to_max[h] = reference_change(reference[h], exp2_reference(row_max[h]), row_max[h], p.scale_log2);
    row_sum[h] *= to_max[h];
  }
  rescale_changed_rows(o, to_max[0], to_max[1]);

  // Row statistics: each warpgroup's sums over its tiles meet; even publishes.
  float* sum_s = reinterpret_cast<float*>(smem + Layout::kRowSum);
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] = row_reduce_sum<4>(row_sum[h]);
  if constexpr (kOdd) publish_rows(sum_s, row_sum, row0, lane);
  named_barrier_sync(kConsumers, kConsumerThreads);  // odd's sums in; both done with pair_max_s
  // Where the output is staged in the Q tile (not by tensor stores), the next Q waits for it.
  const bool by_tensor_stores = output_by_tensor_stores<Loader::kDim>(p);
  const bool in_q_tile = output_is_staged(p) && !by_tensor_stores;
  if (!kOdd && !in_q_tile) query_free();  // every wgmma that read the Q tile has completed
  if (!kOdd && thread == 0) trace_item(kItemStatsDone);
  if constexpr (!kOdd) {
    float row_total[2] = {row_sum[0], row_sum[1]};
    if (lane % 4 == 0) {  // the lane that publishes (and then rewrites sum_s)
      row_total[0] += sum_s[row0];
      row_total[1] += sum_s[row0 + 8];
    }
    publish_block_rows<Loader::kDim>(p, smem, token, head0, split, row0, lane, row_max, row_total);
  }
  named_barrier_sync(kConsumers, kConsumerThreads);
  // The output's addresses are formed from a lane the compiler cannot see through:
  // hoisted out of a persistent CTA's loop over work items, they took registers
  // that the loop over pairs needs (ptxas spilled them, and the reloads missed L1).
  int output_lane = lane;
  asm volatile("" : "+r"(output_lane));
  if (by_tensor_stores && p.out_box_rows == 64) {
    write_output_by_tensor_stores<Loader::kDim, 64>(p, o, smem, token, head0, kOwn, warp, output_lane);
  } else if (by_tensor_stores) {
    write_output_by_tensor_stores<Loader::kDim, 16>(p, o, smem, token, head0, kOwn, warp, output_lane);
  } else {
    write_output_half<Loader::kDim>(p, o, smem, token, head0, split, kOwn,
                                    reinterpret_cast<const float*>(smem + Layout::kRowMax), sum_s, warp, output_lane);
  }
  if (!kOdd && thread == 0) trace_item(kItemStoresIssued);
  // The staged output's reads of the Q tile (and of the row statistics), before the
  // next item's Q arrives there through the async proxy.
  fence_view_async_shared();
  named_barrier_sync(kConsumers, kConsumerThreads);
  if (!kOdd && thread == 0) trace_item(kItemOutputDone);
  if (!kOdd && in_q_tile) query_free();
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The work items of one launch of the alternating kernel: the (token, head block,
// split) blocks a grid of tokens x head_blocks x splits would start, one item each
// (at most INT_MAX of them: the launch checks).
struct WorkGrid {
  int tokens;
  int head_blocks;
  int splits;
  __host__ __device__ int items() const { return tokens * head_blocks * splits; }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
struct WorkItem {
  int token;
  int head0;
  int split;
};
// Item `index`, numbered as the blocks of that grid start (x fastest);
// kTokenMajor: a token's head blocks in a row, so the second finds the rows in L2.
template <bool kTokenMajor>
__device__ __forceinline__ WorkItem work_item(const WorkGrid& work, int index) {
  const int per_split = work.tokens * work.head_blocks;
  const int split = index / per_split;
  const int block = index - split * per_split;
  if constexpr (kTokenMajor) return {block / work.head_blocks, block % work.head_blocks * kRows, split};
  return {block % work.tokens, block / work.tokens * kRows, split};
}
#endif

// The kernel of copied rows (bf16 caches, the flat prefill workspace, staged FP8
// rows): CTA c runs items c, c + gridDim.x, ... of `work`. A grid of fewer CTAs than
// items (persistent: one per SM) keeps each CTA's barriers, registers and
// producer across its items: the producer fills the next item's first pair of
// tiles while the consumers finish the last, and the next item's Q is requested
// as soon as they are done with this one's, so a short key list no longer pays a
// CTA start and the first row gathers per item (docs/cuda_sm90.md).
template <class Loader, bool kTokenMajor>
__global__ void __launch_bounds__(kThreads, 1)
    sm90_alternating_kernel(const __grid_constant__ SparseAttentionParams p, const WorkGrid work) {
  static_assert(Loader::kCopiesRows);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  allow_dependent_launch();
  // Staged FP8 rows: of the copying grid and the direct one, only the one the staging chose works.
  if (p.run_gate != nullptr && *p.run_gate != p.run_gate_value) return;
  using Layout = Sm90Layout<Loader::kDim>;
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  std::uint8_t* smem = aligned_shared_memory(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    if (p.q_by_tensor_map) prefetch_tensor_map(p.q_tensor_map);  // fetched while the barriers are set up
    if (p.out_by_tensor_map) prefetch_tensor_map(p.out_tensor_map);
    mbarrier_init(smem_address(smem + Layout::kQueryLoaded), 1);
    init_half_barriers<Loader::kDim>(smem);
    fence_mbarrier_init_cluster();  // the barriers, before tensor loads (async proxy) complete on one
    trace(kTraceStart);  // the first item's spans count from here
  }
  __syncthreads();

  // Each warpgroup walks the same items (skip: those whose split has no keys). Its
  // register budget is set once, ahead of its own loop (ptxas keeps a setmaxnreg
  // only where the code after it is one warpgroup's). What a loop carries from
  // item to item is kept to two bits: the consumers' registers are all O's and S's.
  // This CTA's item after `index`, work.items() past its last (no int overflow).
  auto next_index = [&](int index) {
    return work.items() - index > static_cast<int>(gridDim.x) ? index + static_cast<int>(gridDim.x) : work.items();
  };
  auto for_each_item = [&](auto&& run, auto&& skip) {
    int pair_parity = 0;   // of the item's first pair of tiles (the K barriers' phases)
    int query_parity = 0;  // kQueryLoaded's phase: every item has a Q load, an empty one too
    for (int index = static_cast<int>(blockIdx.x); index < work.items(); index = next_index(index)) {
      const WorkItem item = work_item<kTokenMajor>(work, index);
      const SplitKeys keys = split_keys<kKeys>(token_key_counts(p, item.token), p.num_splits, item.split);
      if (keys.begin >= keys.end) {
        write_empty_split_rows<kRows, kThreads>(p, item.split, tid, block_rows(p, item.token, item.head0));
        skip(index, query_parity);
      } else {
        const int num_pairs = ((keys.end - keys.begin + kKeys - 1) / kKeys + 1) / 2;  // odd counts: an empty tile
        run(index, item, keys, num_pairs, pair_parity, query_parity);
        pair_parity ^= num_pairs & 1;
      }
      query_parity ^= 1;
    }
  };
  // The Q tile by the tensor map is requested an item ahead, as soon as both
  // consumer warpgroups are done with the last (the lengths of the item it is for
  // are not known yet: an empty item's Q is loaded and waited for all the same).
  auto request_next_query = [&](int index) {
    const int next_item = next_index(index);
    if (tid == 0 && p.q_by_tensor_map && next_item < work.items()) {
      const WorkItem next = work_item<kTokenMajor>(work, next_item);
      request_query<Loader::kDim>(p, next.token, next.head0, smem);
    }
  };
  auto skip_query = [&](int query_parity) {
    if (!p.q_by_tensor_map) return;
    mbarrier_wait(smem_address(smem + Layout::kQueryLoaded), query_parity);
    named_barrier_sync(kConsumers, kConsumerThreads);  // both warpgroups saw this phase complete
  };
  using Budget = RegisterBudget<true>;
  const int warpgroup = tid / 128;
  if (warpgroup == 2) {
    set_registers<Budget::kProducer>();
    for_each_item(
        [&](int, const WorkItem& item, const SplitKeys& keys, int num_pairs, int pair_parity, int) {
          run_alternating_producer<Loader>(p, smem, item.token, keys.begin, keys.end, keys.n_main, num_pairs,
                                           pair_parity, tid - kConsumerThreads);
        },
        [](int, int) {});
  } else if (warpgroup == 0) {
    if (tid == 0 && p.q_by_tensor_map) {  // the first item's, before the register hand-over
      const WorkItem first = work_item<kTokenMajor>(work, static_cast<int>(blockIdx.x));
      request_query<Loader::kDim>(p, first.token, first.head0, smem);
    }
    set_registers<Budget::kScore>();
    for_each_item(
        [&](int index, const WorkItem& item, const SplitKeys&, int num_pairs, int pair_parity, int query_parity) {
          stage_query<Loader::kDim>(p, item.token, item.head0, smem, tid, query_parity);
          if (tid == 0) trace_item(kItemQueryIn);
          run_alternating_consumer<Loader, false>(p, smem, item.token, item.head0, item.split, num_pairs, pair_parity,
                                                  tid, [&] { request_next_query(index); });
        },
        [&](int index, int query_parity) {
          skip_query(query_parity);
          request_next_query(index);
        });
  } else {
    set_registers<Budget::kValue>();
    for_each_item(
        [&](int, const WorkItem& item, const SplitKeys&, int num_pairs, int pair_parity, int query_parity) {
          stage_query<Loader::kDim>(p, item.token, item.head0, smem, tid, query_parity);
          run_alternating_consumer<Loader, true>(p, smem, item.token, item.head0, item.split, num_pairs, pair_parity,
                                                 tid - 128, [] {});
        },
        [&](int, int query_parity) { skip_query(query_parity); });
  }
  trace_finish(0);
#else
  (void)p;  // never launched: the host uses this kernel only on sm_90 devices of an sm_90a build
  (void)work;
#endif
}
