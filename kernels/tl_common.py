"""Triton device helpers shared by the decode kernels: gates, ring-buffer entries,
window decay, and the per-slot counters that let one launch per step advance
the ring without any host synchronisation.

Ring layout (per state slot, capacity ``L`` entries, entry ``i`` = the i-th step
since the checkpoint): ``ring_x (slots, L, heads, P)``, ``ring_B (slots, L,
groups, N)`` in the ring dtype (``RING_*``: fp32, or bf16/fp16 as int16 bits),
``ring_dt (slots, L, heads)`` float32.  Counters are int32 per slot:
``ring_len`` (speculative caches: committed entries in the low 16 bits, the ring
half above), ``steps`` (tokens committed, the SR step), ``tickets`` (the clock).

Counter protocols (no host synchronisation, CUDA-graph capturable):

* clock (replay steps): every program of a slot reads ``tickets[slot]`` once and
  then adds 1 without waiting for the result.  Within one launch at most
  ``programs_per_slot - 1`` other increments can precede a read, so
  ``tickets // programs_per_slot`` is the same step count ``k`` for every program
  of the launch; the ring position is ``k mod L``.
* ticket (conventional steps with stochastic rounding): every program reads
  ``steps[slot]``, takes a ticket at its end (atomic add), and the program that
  draws the last ticket publishes ``steps + 1`` (:func:`finish_slot`).
* speculative caches: ``ring_len`` / ``steps`` are written only by the commit
  kernel, one program per batch row.

Speculative caches hold two ring halves of ``L`` entries (``LR = 2L`` rows per
slot): a verify that must flush reads the committed entries of one half while
its drafts go to the other, so no program overwrites entries that another
program of the same launch still reads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tl_formats import bf16_bits_to_f32, bf16_rne_bits, fp16_bits_to_f32, fp16_rne_bits

RING_FP32 = 0
RING_BF16 = 1
RING_FP16 = 2
K_RING_FP32 = tl.constexpr(RING_FP32)
K_RING_BF16 = tl.constexpr(RING_BF16)
K_RING_FP16 = tl.constexpr(RING_FP16)


@triton.jit
def log1p_pos(u):
    """log(1 + u) for 0 <= u <= 1, accurate to ~1e-6 relative even where the fast
    hardware log is not (series below 0.1)."""
    series = u * (1.0 - u * (0.5 - u * (0.3333333333 - u * (0.25 - u * (0.2 - u * (
        0.1666666667 - u * 0.1428571429))))))
    return tl.where(u < 0.1, series, tl.log(1.0 + u))


@triton.jit
def softplus(v):
    """torch ``F.softplus(v, threshold=20)``: v above 20, else log1p(exp(v))."""
    sp = tl.maximum(v, 0.0) + log1p_pos(tl.exp(-tl.abs(v)))
    return tl.where(v > 20.0, v, sp)


@triton.jit
def gate(y, x, z, D, HAS_Z: tl.constexpr):
    """``(y + D x) * silu(z)`` (no gate without z)."""
    y = y + D * x
    if HAS_Z:
        y = y * (z * tl.sigmoid(z))
    return y


@triton.jit
def ring_round(v, RING: tl.constexpr):
    """The float32 value ``v`` takes when stored in the ring dtype."""
    if RING == K_RING_BF16:
        r = bf16_bits_to_f32(bf16_rne_bits(v))
    elif RING == K_RING_FP16:
        r = fp16_bits_to_f32(fp16_rne_bits(v))
    else:
        r = v
    return r


@triton.jit
def ring_decode(raw, RING: tl.constexpr):
    """float32 values of raw ring entries (as :func:`ring_load_raw` loads them)."""
    if RING == K_RING_BF16:
        v = bf16_bits_to_f32(raw)
    elif RING == K_RING_FP16:
        v = fp16_bits_to_f32(raw)
    else:
        v = raw
    return v


@triton.jit
def ring_load_raw(ptrs, mask, RING: tl.constexpr):
    """Load ring entries without converting them (a prefetch that does not stall)."""
    if RING == K_RING_FP32:
        v = tl.load(ptrs, mask=mask, other=0.0)
    else:
        v = tl.load(ptrs, mask=mask, other=0)
    return v


@triton.jit
def ring_load(ptrs, mask, RING: tl.constexpr):
    """Load ring entries as float32 (masked entries zero)."""
    return ring_decode(ring_load_raw(ptrs, mask, RING), RING)


@triton.jit
def ring_store(ptrs, v, mask, RING: tl.constexpr):
    """Store float32 ``v`` (already on the ring grid) into the ring."""
    if RING == K_RING_BF16:
        tl.store(ptrs, bf16_rne_bits(v), mask=mask)
    elif RING == K_RING_FP16:
        tl.store(ptrs, fp16_rne_bits(v), mask=mask)
    else:
        tl.store(ptrs, v, mask=mask)


@triton.jit
def dt_of(dt_raw, dt_bias, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """Step size from the raw input: ``softplus(dt + dt_bias)`` or as given."""
    dt = dt_raw.to(tl.float32)
    if HAS_DT_BIAS:
        dt = dt + dt_bias
    if DT_SOFTPLUS:
        dt = softplus(dt)
    return dt


@triton.jit
def decay_weights(dts, cum, offs_r, q):
    """``(Lambda_q, w)`` for an output at entry ``q``: ``Lambda_q = cum[q]`` (exact
    pick) and ``w_i = dt_i exp(Lambda_q - cum_i)`` for ``i <= q``, else 0."""
    last = tl.sum(tl.where(offs_r == q, cum, 0.0), axis=0)
    w = dts * tl.where(offs_r <= q, tl.exp(last - cum), 0.0)
    return last, w


@triton.jit
def finish_slot(tickets, ring_len, steps, slot, nprog, new_len, new_steps):
    """Take a ticket; the slot's last program publishes the new counters."""
    old = tl.atomic_add(tickets + slot, 1)
    if old == nprog - 1:
        tl.store(ring_len + slot, new_len)
        tl.store(steps + slot, new_steps)
        tl.store(tickets + slot, 0)


@triton.jit
def post_amax_part(sync, amax, PARTS: tl.constexpr):
    """One of PARTS programs that flush a matrix together posts its part of the matrix
    amax (``amax >= 0``: its float bits order as integers) into ``sync[0]`` and counts
    itself in ``sync[1]`` (both zero between flushes).  Returns ``(last, amax_mat)``:
    whether this program completed the count and, if so, the whole matrix's amax; the
    last one also clears both words for the next flush.  Nobody waits, so no launch
    order or residency is assumed.  The count's acquire-release orders what every
    program stored before posting (its scratch rows) before the last one's reads, which
    go to L2 (``.cg``).  Starts and ends with a barrier of the program's warps."""
    tl.debug_barrier()  # every warp's stores and amax are in
    tl.atomic_max(sync, amax.to(tl.int32, bitcast=True), sem="relaxed")
    last = tl.atomic_add(sync + 1, 1, sem="acq_rel") == PARTS - 1
    amax_mat = 0.0
    if last:
        amax_mat = tl.atomic_xchg(sync, 0, sem="acquire").to(tl.float32, bitcast=True)
        tl.atomic_xchg(sync + 1, 0, sem="relaxed")
    tl.debug_barrier()  # no warp reads another program's rows before the acquire
    return last, amax_mat


@triton.jit
def batch_slots(state_idx, B, BP: tl.constexpr):
    """The slots of a launch's ``B`` batch rows as one vector (a persistent flush
    launch's view of the batch): ``(offs_b, inb, live, sl0)``, the rows ``0..BP-1``,
    which are real, which have a slot (index >= 0) and the slot (0 where none)."""
    offs_b = tl.arange(0, BP)
    inb = offs_b < B
    sl = tl.load(state_idx + offs_b, mask=inb, other=-1)
    return offs_b, inb, sl >= 0, tl.maximum(sl, 0)


@triton.jit
def flushing_rows(flag, units_per_row):
    """A persistent flush launch's flushing rows among a batch vector (``flag``): ``key``
    (``j + 1`` at the j-th flushing row, else 0) and the launch's number of units,
    ``units_per_row`` for each flushing row."""
    fl = flag.to(tl.int32)
    return tl.where(flag, tl.cumsum(fl, axis=0), 0), tl.sum(fl, axis=0) * units_per_row


@triton.jit
def at_flushing_row(key, j, values):
    """The entry of batch vector ``values`` at the j-th flushing row (``key`` from
    :func:`flushing_rows`; 0 past the last)."""
    return tl.sum(tl.where(key == j + 1, values, 0), axis=0)


@triton.jit
def claim_unit(work):
    """The next unit of a flush launch whose programs claim their units one at a time
    from the counter ``work[0]`` (zero between launches; see :func:`claim_done`)."""
    return tl.atomic_add(work, 1, sem="relaxed")


@triton.jit
def claim_done(work, G):
    """One of the G programs of a claiming flush launch is done (its last claim came
    back past the units): count it in ``work[1]``; the last one clears both words for
    the next launch.  The count's acquire-release orders every program's claims before
    the clearing."""
    if tl.atomic_add(work + 1, 1, sem="acq_rel") == G - 1:
        tl.atomic_xchg(work, 0, sem="relaxed")
        tl.atomic_xchg(work + 1, 0, sem="relaxed")


@triton.jit
def first_unit(pid, units, work, CLAIM: tl.constexpr):
    """Program ``pid``'s first unit of a persistent flush launch: ``pid``, or with CLAIM
    the first it claims (none is claimed where there are no units)."""
    u = pid
    if CLAIM:
        if units > 0:
            u = claim_unit(work)
    return u


@triton.jit
def next_unit(u, G, work, CLAIM: tl.constexpr):
    """The program's unit after ``u``: G further, or with CLAIM the next it claims."""
    if CLAIM:
        nxt = claim_unit(work)
    else:
        nxt = u + G
    return nxt


@triton.jit
def units_done(units, work, G, CLAIM: tl.constexpr):
    """The end of a program of a persistent flush launch of G programs: with CLAIM (and
    units claimed at all) it counts itself done (:func:`claim_done`)."""
    if CLAIM:
        if units > 0:
            claim_done(work, G)
