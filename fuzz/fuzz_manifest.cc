// Replay manifest reader: parse_manifest on arbitrary text; an accepted
// manifest must survive manifest_to_json -> parse_manifest unchanged.
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "tools/smla/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = smla::cli::parse_manifest(text, "manifest.json");
  if (!m) {
    SMLA_FUZZ_CHECK(!m.status().message().empty());
    return 0;
  }
  auto again = smla::cli::parse_manifest(smla::cli::manifest_to_json(*m), "round-trip.json");
  SMLA_FUZZ_CHECK(again.ok());
  SMLA_FUZZ_CHECK(again->op == m->op && again->softmax_scale == m->softmax_scale && again->q == m->q &&
                  again->sink == m->sink);
  if (m->op == smla::cli::ReplayOp::kSparseDecode) {
    SMLA_FUZZ_CHECK(again->format == m->format && again->main_cache == m->main_cache &&
                    again->main_indices == m->main_indices && again->main_lengths == m->main_lengths &&
                    again->extra_cache == m->extra_cache && again->extra_indices == m->extra_indices &&
                    again->extra_lengths == m->extra_lengths && again->fp8_scale == m->fp8_scale &&
                    again->main_page_stride_bytes == m->main_page_stride_bytes &&
                    again->extra_page_stride_bytes == m->extra_page_stride_bytes);
  } else {
    SMLA_FUZZ_CHECK(again->kv == m->kv && again->indices == m->indices && again->topk_length == m->topk_length &&
                    again->d_v == m->d_v);
  }
  return 0;
}
