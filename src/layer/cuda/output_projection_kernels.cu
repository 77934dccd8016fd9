// Placeholder: device kernels of the CUDA output projection (issue 6).
#include "smla/cuda_layer.h"
