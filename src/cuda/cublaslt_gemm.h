// Placeholder: internal cuBLASLt GEMM wrapper (issue 6).
#pragma once
