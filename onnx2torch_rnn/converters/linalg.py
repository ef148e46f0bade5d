"""Linear algebra: MatMul, Gemm, Einsum."""
