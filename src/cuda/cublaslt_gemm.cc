// Placeholder: internal cuBLASLt GEMM wrapper (issue 6).
#include "src/cuda/cublaslt_gemm.h"
