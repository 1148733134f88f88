"""Fused Triton kernels of the state designs (``precisionlab.kernels``).

Modules (imported on demand, so ``TRITON_INTERPRET`` can still be set first):

* ``tl_formats`` / ``tl_common``: device functions shared by every kernel (format
  codecs bit-exact to ``precisionlab.formats``, stochastic-rounding bits, ring and
  counter helpers).
* ``state`` / ``codec``: device storage of a state in one format; stand-alone
  encode/decode launches.
* ``mamba2_conv`` / ``mamba2_kernel`` / ``mamba2_step`` / ``mamba2_spec``: Mamba-2
  conventional step, replay step, speculative verify and commit.
* ``mamba2_backend`` / ``backend``: the engine's Triton runners.
* ``bandwidth``: the copy and read probes behind ``precisionlab.timing.bandwidth``.
* ``precompile`` / ``compile_worker``: a study's kernels compiled in parallel (in worker
  processes, into Triton's disk cache) before it runs.
* ``testing``: run the kernels in the Triton interpreter where there is no GPU.
"""
