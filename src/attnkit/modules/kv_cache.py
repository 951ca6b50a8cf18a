"""Preallocated caches for incremental decoding (the gpt-fast design): each attention layer's
keys and values (:class:`KVCache`), and, for batches of padded prompts, which slots are padding
and where each row is (:class:`PaddingCache`)."""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

CACHE_LAYOUTS = ("heads", "positions")


class KVCache:
    """Keys and values of one attention layer, kept between decoding steps.

    The buffers are allocated once at their full length, so every step writes in place and
    shapes stay fixed; :meth:`reorder` follows the hypotheses that beam search keeps.

    Keys and values are handed out as (B, H, T, hd), the layout attention takes (:attr:`k`,
    :attr:`v`); ``layout`` says how they are stored:

    * ``"heads"`` (B, H, T_max, hd): each head's keys are contiguous, which a long cache needs
      (at 4,096 positions a decoding step reads them 8-11% faster than position-major);
    * ``"positions"`` (B, T_max, H, hd): the positions filled so far are one contiguous block
      per row, so a beam step's :meth:`reorder` copies exactly them, row by row, into a spare
      buffer (3-4x faster than gathering a head-major slice and writing it back; the
      translation decoder's beam search, docs/benchmarks.md).

    With a sliding ``window`` (a layer whose queries see only the last ``window`` keys) the
    buffers hold ``min(max_len, window)`` slots, whatever the length generated: slot ``s`` is
    stored at ``s % window`` (a ring buffer), keys already rotated (RoPE), so no key needs its
    position again. One new token overwrites the oldest slot and attends to the ring in its
    stored order (attention does not depend on the order of the keys, only the key mask must
    follow it: :meth:`select_keys`); several new tokens (a prompt) attend to the kept keys and
    themselves in order, and the last ``window`` of them are stored.

    Args:
        batch_size: rows (sentences x beams).
        num_heads: key/value heads (H, or H_kv with grouped-query attention).
        max_len: the most positions the cache will take.
        head_dim: size of one head's keys and values.
        window: keep only the last ``window`` positions (None: all).
        dtype: buffer dtype.
        device: buffer device.
        layout: ``"heads"`` or ``"positions"`` (above).
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        max_len: int,
        head_dim: int,
        *,
        window: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        layout: str = "heads",
    ) -> None:
        if layout not in CACHE_LAYOUTS:
            raise ValueError(f"KVCache: layout must be one of {CACHE_LAYOUTS}, got {layout!r}")
        sizes = dict(batch_size=batch_size, num_heads=num_heads, max_len=max_len, head_dim=head_dim)
        for name, value in sizes.items():
            smallest = 0 if name == "batch_size" else 1
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Integral)
                or value < smallest
            ):
                raise ValueError(f"KVCache: {name} must be an integer >= {smallest}, got {value!r}")
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1
        ):
            raise ValueError(f"KVCache: window must be an integer >= 1 or None, got {window!r}")
        window = None if window is None else int(window)  # numpy integers too
        capacity = max_len if window is None else min(max_len, window)
        self._by_position = layout == "positions"
        shape = (batch_size, capacity, num_heads, head_dim)  # (B, T_max, H, hd)
        if not self._by_position:
            shape = (batch_size, num_heads, capacity, head_dim)  # (B, H, T_max, hd)
        # Uninitialised: only the first `length` positions are ever read, and zero-filling
        # every buffer costs a noticeable share of a short decode.
        self._k = torch.empty(shape, dtype=dtype, device=device)
        self._v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        self.window = window
        self._max_len = max_len
        # How the keys the last update returned sit among the slots 0 .. length - 1:
        # (first slot, ring shift): slots first .. length - 1 in order, rolled by the shift.
        self._keys = (0, 0)

    @property
    def layout(self) -> str:
        return "positions" if self._by_position else "heads"

    @property
    def k(self) -> Tensor:
        """The key buffer as (B, H, T_max, hd) (a view of the storage)."""
        return self._k.transpose(1, 2) if self._by_position else self._k

    @property
    def v(self) -> Tensor:
        """The value buffer as (B, H, T_max, hd)."""
        return self._v.transpose(1, 2) if self._by_position else self._v

    @property
    def nbytes(self) -> int:
        """Bytes of the memory holding the keys and values (after a position-major reorder to
        fewer rows, the whole spare buffer they were gathered into)."""
        return self._k.untyped_storage().nbytes() + self._v.untyped_storage().nbytes()

    @property
    def max_len(self) -> int:
        return self._max_len

    @property
    def capacity(self) -> int:
        """Slots the buffers hold: ``max_len``, or ``min(max_len, window)``."""
        return self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H, T, hd) keys and values; return every key and value the new queries may
        see: all cached so far (B, H, T_so_far, hd), or, with a window, at most ``window - 1``
        before the new ones and the new ones."""
        keys, values = self.k, self.v  # (B, H, capacity, hd) views of the buffers
        b, h, capacity, hd = keys.shape
        if k.shape != v.shape or k.dim() != 4 or (k.shape[0], k.shape[1], k.shape[3]) != (b, h, hd):
            raise ValueError(
                f"KVCache.update: expected k and v of shape ({b}, {h}, T, {hd}), got "
                f"{tuple(k.shape)} and {tuple(v.shape)}"
            )
        start, t = self.length, k.shape[2]
        end = start + t
        if end > self._max_len:
            raise ValueError(
                f"KVCache.update: {end} positions exceed the cache's max_len={self._max_len}"
            )
        self.length = end
        if end <= capacity:  # every slot so far is in the buffers, in order
            keys.narrow(2, start, t).copy_(k)
            values.narrow(2, start, t).copy_(v)
            self._keys = (0, 0)
            return keys.narrow(2, 0, end), values.narrow(2, 0, end)  # (B, H, T_so_far, hd)
        if t == 1:  # a ring: the new slot replaces the oldest
            keys[:, :, start % capacity] = k[:, :, 0]
            values[:, :, start % capacity] = v[:, :, 0]
            self._keys = (end - capacity, end % capacity)
            return keys, values  # (B, H, window, hd), in ring order
        # Several new slots past the window: the kept ones in order, then the new ones.
        kept = min(start, capacity)
        shift = start % capacity if start > capacity else 0
        new_k = torch.cat([keys.roll(-shift, dims=2)[:, :, :kept], k], dim=2)  # (B, H, n, hd)
        new_v = torch.cat([values.roll(-shift, dims=2)[:, :, :kept], v], dim=2)
        # Slot s goes to s % capacity: the last `capacity` slots, rolled into place.
        keys.copy_(new_k[:, :, -capacity:].roll(end % capacity, dims=2))
        values.copy_(new_v[:, :, -capacity:].roll(end % capacity, dims=2))
        self._keys = (end - new_k.shape[2], 0)
        return new_k, new_v

    def _state(self) -> tuple[int, tuple[int, int]]:
        """What :meth:`_undo` needs to take back the next :meth:`update` (two ints, no tensor)."""
        return self.length, self._keys

    def _undo(self, state: tuple[int, tuple[int, int]], keys: Tensor, values: Tensor) -> None:
        """Take back the :meth:`update` made since :meth:`_state` gave ``state``, which returned
        ``keys`` and ``values``: a caller that fails after the update (a bad mask, an interrupt)
        leaves the cache as it was, so that a retry does not see the new keys twice.

        Putting the length back is enough where the update only wrote slots past it. Several
        new slots that overran a sliding window's ring rewrote all of it: the ring's kept slots
        lead the keys that update returned, and are written back from there. One new slot past
        the window overwrote the oldest, which no later query's window reaches.
        """
        start, placement = state
        end, capacity = self.length, self.capacity
        self.length, self._keys = start, placement
        if end - start > 1 and end > capacity and start > 0:
            kept = min(start, capacity)
            shift = start % capacity if start > capacity else 0  # as update rolled them
            self.k[:, :, :kept].copy_(keys[:, :, :kept].roll(shift, dims=2))
            self.v[:, :, :kept].copy_(values[:, :, :kept].roll(shift, dims=2))

    def select_keys(self, mask: Tensor) -> Tensor:
        """The columns of ``mask`` (..., T_so_far), over every slot so far, that belong to the
        keys the last :meth:`update` returned, in their order: ``mask`` itself when the cache
        keeps every slot."""
        first, shift = self._keys
        if first == 0 and shift == 0:
            return mask
        mask = mask[..., first:]  # (..., T_k) in slot order
        return mask.roll(shift, dims=-1) if shift else mask

    def get(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values in slot order, (B, H, T_kept, hd) each."""
        if self.length <= self.capacity:
            return self.k[:, :, : self.length], self.v[:, :, : self.length]
        shift = self.length % self.capacity
        return self.k.roll(-shift, dims=2), self.v.roll(-shift, dims=2)

    def reorder(self, index: Tensor, spare: Tensor | None = None) -> Tensor | None:
        """Keep rows ``index`` (B',) of the batch: the hypotheses a beam step selects, or the
        rows of the sentences still decoding. Only the filled positions are copied, so a step
        costs O(length), not O(max_len).

        Head-major, a beam step (as many rows as before) gathers the filled part and writes
        it back in place; a batch of another size gets new buffers. Position-major, each row's
        filled block is gathered into the first B' rows of a spare buffer, which then holds
        the cache, with nothing written back: the buffer the keys leave takes the values, and
        the one the values leave is returned, for the next layer's reorder (``spare``), so a
        decoder's layers pass one spare buffer along and, once it is large enough, a beam
        search allocates nothing more (None or a smaller one: a new one is made). ``spare``
        must be a buffer no cache holds (the one a reorder returned): it is written over
        without a check. Returns the spare buffer (None head-major). Buffers that autograd
        records (filled under gradients) are gathered whole into new ones instead.
        """
        n = min(self.length, self.capacity)
        rows = index.shape[0]
        if torch.is_grad_enabled() and (self._k.requires_grad or self._v.requires_grad):
            self._k = self._k.index_select(0, index)  # out= below would not record gradients
            self._v = self._v.index_select(0, index)
            return spare
        if not self._by_position and rows == self._k.shape[0]:
            # The right side is gathered into a new tensor before the write: no aliasing.
            self._k[:, :, :n] = self._k[:, :, :n].index_select(0, index)
            self._v[:, :, :n] = self._v[:, :, :n].index_select(0, index)
            return None

        def filled(t: Tensor) -> Tensor:  # the positions written so far
            return t[:, :n] if self._by_position else t[:, :, :n]

        for name in ("_k", "_v"):
            old = getattr(self, name)
            if (
                not self._by_position  # head-major: always new buffers
                or spare is None
                or spare.shape[1:] != old.shape[1:]
                or spare.shape[0] < rows
                or spare.dtype != old.dtype
                or spare.device != old.device
            ):
                spare = old.new_empty((rows, *old.shape[1:]))
            target = spare[:rows]  # (B', ...) contiguous
            torch.index_select(filled(old), 0, index, out=filled(target))
            setattr(self, name, target)
            spare = old if old._base is None else old._base  # the whole buffer it lives in
        return spare if self._by_position else None


def positions_from_mask(keep: Tensor | None, t: int, *, start: Tensor | int = 0) -> Tensor:
    """Each slot's position: ``start`` plus the number of real tokens before it in its row.

    That is Hugging Face's ``cumsum(attention_mask) - 1`` for real tokens. A padding slot gets
    the position of its row's last real token (0 before any), which is always in range and
    never attended to.

    Args:
        keep: (B, T) bool, True = real token; None = every slot is real.
        t: number of slots T.
        start: real tokens already seen per row, (B,) or a number.

    Returns:
        (B, T) long, or (1, T) when ``keep`` is None and ``start`` is a number.
    """
    if isinstance(start, int):
        start = torch.tensor([start], device=None if keep is None else keep.device)
    if keep is None:
        steps = torch.arange(t, device=start.device)  # (T,)
        return start[:, None] + steps  # (B, T)
    before = keep.long().cumsum(dim=1) - keep.long()  # (B, T) real tokens before each slot
    pos = start[:, None] + before  # (B, T)
    return torch.where(keep, pos, (pos - 1).clamp(min=0))


class PaddingCache:
    """Which cached slots hold real tokens, and the position each row has reached.

    A batch of prompts of different lengths is padded to one length, so every row fills the
    same cache slots at every step, but a row's *position* counts only its real tokens (Hugging
    Face's ``position_ids = cumsum(attention_mask) - 1``). This cache keeps, beside the layers'
    :class:`KVCache`\\ s, a preallocated (B, max_len) boolean "slot holds a real token" buffer
    and each row's count of real tokens, so that padding is never attended to and left- and
    right-padded prompts both continue at the right position.

    Args:
        batch_size: rows.
        max_len: the most slots the cache will hold (padding slots included).
        device: buffer device.
    """

    def __init__(
        self, batch_size: int, max_len: int, *, device: torch.device | str | None = None
    ) -> None:
        if batch_size < 1 or max_len < 1:
            raise ValueError(
                f"PaddingCache: batch_size and max_len must be >= 1, got batch_size={batch_size}, "
                f"max_len={max_len}"
            )
        self.keep = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.counts = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.length = 0
        self.has_padding = False  # False while every filled slot is a real token

    @property
    def max_len(self) -> int:
        return self.keep.shape[1]

    @property
    def batch_size(self) -> int:
        return self.keep.shape[0]

    def positions(self, keep: Tensor | None, t: int) -> Tensor:
        """Positions (B, T) of ``t`` new slots (:func:`positions_from_mask`), not recorded."""
        return positions_from_mask(keep, t, start=self.counts)

    def update(self, keep: Tensor | None, t: int) -> Tensor | None:
        """Record ``t`` new slots (``keep`` (B, T) bool, True = real token; None = all real).

        Returns:
            The key mask over every filled slot, (B, 1, T_so_far) bool, True = real token; or
            None when no filled slot is padding (so the attention can take its unmasked path).
        """
        b = self.batch_size
        if keep is not None and keep.shape != (b, t):
            raise ValueError(
                f"PaddingCache.update: expected keep of shape ({b}, {t}), got {tuple(keep.shape)}"
            )
        end = self.length + t
        if end > self.max_len:
            raise ValueError(
                f"PaddingCache.update: {end} positions exceed the cache's max_len={self.max_len}"
            )
        if keep is None:
            self.keep[:, self.length : end] = True
            self.counts += t
        else:
            self.keep[:, self.length : end] = keep
            self.counts += keep.sum(dim=1)
            # A meta mask (shapes only) may hold padding: keep the mask, whose shape is known.
            self.has_padding = self.has_padding or keep.is_meta or not bool(keep.all())
        self.length = end
        return self.keep[:, None, :end] if self.has_padding else None  # (B, 1, T_so_far)

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (B',), as :meth:`KVCache.reorder`: in place when the batch keeps
        its size, new buffers when it shrinks."""
        if index.shape[0] == self.batch_size:
            self.keep[:, : self.length] = self.keep[:, : self.length].index_select(0, index)
            self.counts[:] = self.counts.index_select(0, index)
        else:
            self.keep = self.keep.index_select(0, index)
            self.counts = self.counts.index_select(0, index)
