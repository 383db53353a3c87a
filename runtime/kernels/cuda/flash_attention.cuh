// Inside the CUDA module: whether the exact attention kernels (attention.cu) hand a bf16
// call to the flash kernels (flash_attention.cu). Only for nvcc.
#pragma once

namespace ds::rt::cuda {

// True when this thread's attention kernel is kFlash, flash runs head size hd and every pointer
// is 16-byte aligned.
bool use_flash_attention(int hd, const void* a, const void* b, const void* c, const void* d);

}  // namespace ds::rt::cuda
