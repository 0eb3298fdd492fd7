/*
 * move_convert.cu -- fast path between F16, BF16 and F32 (through FP32, RNE).
 */
#include "move_kernels.cuh"

namespace kvx_cuda {

template <class In>
static cudaError_t to_float(kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  switch (dst) {
    case KVX_DTYPE_F16: return launch_fast_op<ConvOp<In, TF16>>(p, stream);
    case KVX_DTYPE_BF16: return launch_fast_op<ConvOp<In, TBF16>>(p, stream);
    case KVX_DTYPE_F32: return launch_fast_op<ConvOp<In, TF32>>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_convert_float(kvx_dtype_t src, kvx_dtype_t dst, const MoveParams& p, cudaStream_t stream) {
  if (src == dst) return cudaErrorInvalidValue; /* copies go through launch_copy */
  switch (src) {
    case KVX_DTYPE_F16: return to_float<TF16>(dst, p, stream);
    case KVX_DTYPE_BF16: return to_float<TBF16>(dst, p, stream);
    case KVX_DTYPE_F32: return to_float<TF32>(dst, p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kvx_cuda
