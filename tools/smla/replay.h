// Replaying one attention call stored on disk (manifest.json + .npy files,
// docs/replay.md), and writing such a directory from in-memory arguments.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "smla/attention.h"
#include "smla/backend.h"
#include "smla/status.h"
#include "testkit/testkit.h"
#include "tools/smla/manifest.h"

namespace smla::cli {

struct ReplayReport {
  ReplayOp op = ReplayOp::kSparseDecode;
  Backend backend = Backend::kReference;  // the backend that ran (auto resolved)
  std::vector<std::string> shapes;        // "q: bf16[6, 64, 512]", one per tensor argument
  std::vector<std::filesystem::path> written;
  double seconds = 0.0;  // the attention call alone
};

// Loads the call stored in case_dir, runs it on `backend` and writes out.npy
// and lse.npy (sparse_prefill: also max_logits.npy) into out_dir, created when
// missing. Outputs are poisoned before the call, so an element the backend does
// not write shows as NaN. Errors name the file and the manifest key.
Expected<ReplayReport> replay_case(const std::filesystem::path& case_dir, const std::filesystem::path& out_dir,
                                   Backend backend);

// Writes `args` (CPU tensors, any strides) as a replay directory: one .npy per
// present tensor argument and manifest.json. A padded page stride is recorded
// as main/extra_page_stride_bytes. With with_outputs, out.npy and lse.npy
// (prefill: and max_logits.npy) are written from the argument's outputs too.
Status write_replay_case(const std::filesystem::path& dir, const SparseDecodeArgs& args, bool with_outputs = false);
Status write_replay_case(const std::filesystem::path& dir, const SparsePrefillArgs& args, bool with_outputs = false);

struct OutputCheck {
  std::string file;  // "out.npy"
  testkit::ErrorStats stats;
};

// Compares every output file present in want_dir (out.npy required; lse.npy
// and max_logits.npy when present) with the same file in got_dir, by the rule
// in check.h. Missing or malformed files are errors; mismatches are not (read
// each OutputCheck's stats.passed()).
Expected<std::vector<OutputCheck>> check_replay_outputs(const std::filesystem::path& got_dir,
                                                        const std::filesystem::path& want_dir);

}  // namespace smla::cli
