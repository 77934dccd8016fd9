// Placeholder: entry points of smla/cuda_model.h for builds without the CUDA backend.
