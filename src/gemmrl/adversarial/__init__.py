"""Candidates that try to cheat or crash, and the checks that they cannot: the planted Triton and CUDA kernels
(planted, planted_cuda), the catalogue run through the sandbox (catalogue) and the false-rejection sweep of the
battery (false_rejections)."""
