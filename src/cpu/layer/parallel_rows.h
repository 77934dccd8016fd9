// Internal (kCpu): helpers for running a layer op's tokens in parallel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace smla::layer_detail {

// keep[t] is true when token t's store is the last one to its slot in token
// order (slot_of(t) < 0: no store). Stores run in parallel, so where two
// tokens share a slot only the later one writes: the bytes left equal those
// of a serial run in token order.
template <class SlotOf>
std::vector<bool> last_store_per_slot(std::int64_t tokens, SlotOf&& slot_of) {
  std::vector<std::pair<std::int64_t, std::int64_t>> stores;  // (slot, token)
  stores.reserve(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t slot = slot_of(t);
    if (slot >= 0) stores.emplace_back(slot, t);
  }
  std::sort(stores.begin(), stores.end());
  std::vector<bool> keep(static_cast<std::size_t>(tokens), false);
  for (std::size_t i = 0; i < stores.size(); ++i) {
    if (i + 1 == stores.size() || stores[i + 1].first != stores[i].first) {
      keep[static_cast<std::size_t>(stores[i].second)] = true;
    }
  }
  return keep;
}

}  // namespace smla::layer_detail
