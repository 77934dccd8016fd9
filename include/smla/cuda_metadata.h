// File: cuda_metadata.h  (placeholder: the device metadata API lands with issue 6)
#pragma once
