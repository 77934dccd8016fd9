// Placeholder: entry points of smla/cuda_metadata.h for builds without the CUDA backend.
#include "smla/cuda_metadata.h"
