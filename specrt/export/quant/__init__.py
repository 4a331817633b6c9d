"""Quantization of exported graphs: int8/int4 blocks (MatMulNBits, HQQ), the integer kernel, a GGUF's own Q4/Q8
blocks kept, token lookups and tied heads, the kernel chosen by timing, and the quality gate each must pass.
Imports graph/ (graph edits), the staging helpers and bundle/."""
