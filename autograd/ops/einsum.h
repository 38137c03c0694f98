#pragma once
// einsum, as torch.einsum: Einstein summation over labelled dims, composed of differentiable
// permutes, reshapes, sums and batched matmuls (Note [einsum as matmuls] in einsum.cpp), so
// gradients, double backward, autocast (matmul's float16) and CUDA come with them.
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace frugal {

/// torch.einsum(equation, operands): "bhqd,bhkd->bhqk" labels each operand's dims with letters
/// (a-z, A-Z); labels shared by operands multiply, labels left out of the output are summed.
/// Without "->", the output is the labels that appear once, sorted (upper case first). "..."
/// stands for the dims no letter names, right-aligned and broadcast across operands. A dim of
/// size 1 broadcasts against the same label's other sizes. A label repeated within one
/// operand takes its diagonal ("ii->i"; "ii", a trace).
Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands);

}  // namespace frugal
