// smla::testkit: synthetic DeepSeek-V4 attention cases, comparison metrics and
// output poisoning, shared by the tests, the CLI (smla attn) and the
// benchmarks. Depends on smla only (no test framework).
#pragma once

#include "testkit/compare.h"
#include "testkit/decode_case.h"
#include "testkit/host_tensor.h"
#include "testkit/prefill_case.h"
