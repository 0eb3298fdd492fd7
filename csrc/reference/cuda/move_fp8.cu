/*
 * move_fp8.cu -- fast path quantizing F16/BF16/F32 into an FP8 cache (R-FP8).
 */
#include "move_kernels.cuh"

namespace kvx_cuda {

template <class In>
static cudaError_t to_fp8(kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  switch (dst) {
    case KVX_DTYPE_F8_E4M3: return launch_fast_op<ConvOp<In, TE4M3>>(p, stream);
    case KVX_DTYPE_F8_E5M2: return launch_fast_op<ConvOp<In, TE5M2>>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_convert_fp8(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  switch (src) {
    case KVX_DTYPE_F16: return to_fp8<TF16>(dst, p, stream);
    case KVX_DTYPE_BF16: return to_fp8<TBF16>(dst, p, stream);
    case KVX_DTYPE_F32: return to_fp8<TF32>(dst, p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kvx_cuda
