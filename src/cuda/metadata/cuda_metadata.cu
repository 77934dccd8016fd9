// Placeholder until the device metadata kernels land (issue 6).
#include "smla/cuda_metadata.h"
