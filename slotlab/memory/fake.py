"""A small fake memory for decision-core tests: cells per sequence as (position, token) pairs, sizes
computed from the cell count, no tensors, no model.

It keeps the properties the decisions depend on — a sliding window that drops old cells after a
decode (so `pos_min` rises and checkpoints are needed), state blobs that really round-trip the
cells, a cell pool that can run out ("failed to find free space"), refused partial `seq_rm` on a
recurrent-like memory — so the core's paths can be exercised by the hundred in a second. It is not
a proof of fidelity: the real context and the golden traces are."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from slotlab.memory.base import SEQ_RM_FULL, SEQ_RM_PART, Batch, MemoryInfo
from slotlab.sampling import SamplingParams

_MAGIC = 0x5F4B4146  # "FAK_"


class FakeVocab:
    """Bytes as tokens: token = byte value + 3; 0 pad, 1 end of generation, 2 BOS."""

    n_vocab = 259
    BOS, EOG = 2, 1

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        body = [b + 3 for b in text.encode("utf-8")]
        return np.array(([self.BOS] if add_special else []) + body, dtype=np.int32)

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        return bytes([token - 3]) if token >= 3 else b""

    def detokenize(self, tokens) -> str:
        return b"".join(self.token_to_piece(int(t)) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return int(token) == self.EOG

    def check_tokens(self, tokens) -> None:
        t = np.asarray(tokens)
        if len(t) and (t.min() < 0 or t.max() >= self.n_vocab):
            raise ValueError(f"token ids must be in 0..{self.n_vocab - 1}")


@dataclass
class _Seq:
    pos: list = field(default_factory=list)
    tok: list = field(default_factory=list)


class _FakeSampler:
    last_probs = None  # the fake reports no probabilities

    def __init__(self, mem: "FakeMemory"):
        self.mem = mem

    def sample(self, i: int) -> int:
        """A deterministic token for row `i` of the last decode: printable, never end-of-generation."""
        pos, seq = self.mem.last_rows[i]
        return 3 + ord("a") + (pos * 7 + seq) % 26

    def close(self) -> None:
        pass


class FakeMemory:
    """`Memory` without a model. `n_swa > 0` emulates SWA without --swa-full (cells older than the
    window are dropped after each decode, seq_rm PART); `recurrent=True` emulates a memory whose
    sequences can only be removed whole (seq_rm FULL). `bytes_per_token` sets the state sizes."""

    HEADER = 16

    def __init__(self, n_slots: int = 2, n_ctx: int = 4096, *, n_batch: int = 2048, n_ubatch: int = 512,
                 n_swa: int = 0, recurrent: bool = False, kv_unified: bool = False, bytes_per_token: int = 1024,
                 bytes_per_token_partial: int = 256, n_cells: int | None = None):
        n_ctx_slot = n_ctx if kv_unified else n_ctx // n_slots
        self.info = MemoryInfo(n_ctx=n_ctx, n_seq_max=n_slots, n_ctx_slot=n_ctx_slot, n_batch=n_batch, n_ubatch=n_ubatch,
                               n_swa=n_swa, kv_unified=kv_unified, can_shift=n_swa == 0 and not recurrent,
                               seq_rm_type=SEQ_RM_FULL if recurrent else SEQ_RM_PART, n_vocab=FakeVocab.n_vocab)
        self.vocab = FakeVocab()
        self.recurrent = recurrent
        self.bpt, self.bpt_partial = bytes_per_token, bytes_per_token_partial
        self.n_cells = n_cells if n_cells is not None else (n_ctx if kv_unified else n_ctx_slot)
        self.seqs = [_Seq() for _ in range(n_slots)]
        self.last_rows: list[tuple[int, int]] = []
        self.calls: list[tuple] = []  # every mutating call, for tests to assert on

    # -- sequence operations ----------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        self.calls.append(("seq_rm", seq, p0, p1))
        seqs = self.seqs if seq == -1 else [self.seqs[seq]]
        for s in seqs:
            hi = float("inf") if p1 < 0 else p1
            lo = 0 if p0 < 0 else p0
            if self.recurrent and (lo > 0 or hi != float("inf")) and s.pos:
                if not (lo > max(s.pos)):  # removing nothing is fine; a partial cut is refused
                    return False
            keep = [(p, t) for p, t in zip(s.pos, s.tok) if not lo <= p < hi]
            s.pos, s.tok = [p for p, _ in keep], [t for _, t in keep]
        return True

    def seq_rm_draft(self, seq: int, p0: int, p1: int) -> bool:
        raise ValueError("the fake memory has no draft context")

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("seq_add", seq, p0, p1, delta))
        if not self.info.can_shift:
            raise ValueError("this fake memory cannot shift")
        s = self.seqs[seq]
        hi = float("inf") if p1 < 0 else p1
        s.pos = [p + delta if p0 <= p < hi else p for p in s.pos]

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.seqs[dst] = _Seq(list(self.seqs[src].pos), list(self.seqs[src].tok))

    def seq_keep(self, seq: int) -> None:
        for i, s in enumerate(self.seqs):
            if i != seq:
                s.pos, s.tok = [], []

    def pos_min(self, seq: int) -> int:
        p = self.seqs[seq].pos
        return min(p) if p else -1

    def pos_max(self, seq: int) -> int:
        p = self.seqs[seq].pos
        return max(p) if p else -1

    # -- state blobs: header (magic, n) + positions + tokens, padded to the modelled size ------------

    def _cells(self, seq: int, partial: bool) -> list[tuple[int, int]]:
        s = self.seqs[seq]
        cells = sorted(zip(s.pos, s.tok))
        if partial:
            if self.recurrent:
                return cells[-1:]  # the recurrent state: one "cell" standing for the whole state
            if self.info.n_swa == 0:
                return []
            lo = self.pos_max(seq) - self.info.n_swa + 1
            return [c for c in cells if c[0] >= lo]
        return cells

    def state_size(self, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        n = len(self._cells(seq, partial))
        if partial and n == 0:
            return 0
        return self.HEADER + n * (self.bpt_partial if partial else self.bpt)

    def state_get(self, seq: int, *, draft: bool = False, partial: bool = False, out=None) -> np.ndarray:
        cells = self._cells(seq, partial)
        size = self.state_size(seq, partial=partial)
        buf = out[:size] if out is not None and len(out) >= size else np.zeros(size, dtype=np.uint8)
        if size:
            buf[:] = 0
            head = np.array([_MAGIC, len(cells), 0, 0], dtype=np.int32).view(np.uint8)
            body = np.array([x for c in cells for x in c], dtype=np.int32).view(np.uint8)
            buf[:16] = head
            buf[16:16 + len(body)] = body
        return buf

    def state_set(self, data, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        self.calls.append(("state_set", seq, partial))
        a = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        if len(a) < 16:
            self.seqs[seq] = _Seq()
            return 0
        head = a[:16].view(np.int32)
        if head[0] != _MAGIC:
            self.seqs[seq] = _Seq()
            return 0
        n = int(head[1])
        body = a[16:16 + 8 * n].view(np.int32).reshape(-1, 2)
        self.seqs[seq] = _Seq([int(p) for p, _ in body], [int(t) for _, t in body])
        return len(a)

    def save_file(self, path, seq: int, tokens: np.ndarray) -> int:
        blob = self.state_get(seq)
        toks = np.asarray(tokens, dtype=np.int32)
        with open(path, "wb") as f:
            f.write(np.array([len(toks)], dtype=np.int32).tobytes() + toks.tobytes() + blob.tobytes())
        return 4 + 4 * len(toks) + len(blob)

    def load_file(self, path, seq: int) -> tuple[int, np.ndarray]:
        try:
            raw = np.fromfile(path, dtype=np.uint8)
            n = int(raw[:4].view(np.int32)[0])
            toks = raw[4:4 + 4 * n].view(np.int32).copy()
            if self.state_set(raw[4 + 4 * n:].copy(), seq) == 0:
                return 0, np.empty(0, dtype=np.int32)
            return len(raw), toks
        except (OSError, IndexError, ValueError):
            return 0, np.empty(0, dtype=np.int32)

    # -- decoding ---------------------------------------------------------------------------------

    def _used(self) -> int:
        return sum(len(s.pos) for s in self.seqs)

    def decode(self, batch: Batch, off: int, n: int) -> int:
        self.calls.append(("decode", off, n))
        rows = list(zip(batch.pos[off:off + n].tolist(), batch.seq[off:off + n].tolist(), batch.token[off:off + n].tolist()))
        if self.info.kv_unified:
            if self._used() + n > self.n_cells:
                return 1
        else:
            for sq in set(s for _, s, _ in rows):
                if len(self.seqs[sq].pos) + sum(1 for _, s, _ in rows if s == sq) > self.n_cells:
                    return 1
        for p, sq, t in rows:
            self.seqs[sq].pos.append(p)
            self.seqs[sq].tok.append(t)
        if self.recurrent:  # one state per sequence: only the newest position remains
            for sq in set(s for _, s, _ in rows):
                s = self.seqs[sq]
                i = int(np.argmax(s.pos))
                s.pos, s.tok = [s.pos[i]], [s.tok[i]]
        elif self.info.n_swa > 0:
            for sq in set(s for _, s, _ in rows):
                s = self.seqs[sq]
                lo = max(s.pos) - self.info.n_swa - self.info.n_ubatch + 1
                keep = [(p, t) for p, t in zip(s.pos, s.tok) if p >= lo]
                s.pos, s.tok = [p for p, _ in keep], [t for _, t in keep]
        self.last_rows = [(p, s) for p, s, _ in rows]
        return 0

    def decode_draft(self, batch: Batch, off: int, n: int) -> int:
        raise ValueError("the fake memory has no draft context")

    def sampler(self, *, temperature: float, seed: int, ignore_eos: bool, sampling: SamplingParams | None = None,
                prompt=None) -> _FakeSampler:
        """The fake's tokens are a function of the row alone: no setting of the request changes them."""
        return _FakeSampler(self)

    def draft(self, seq: int, token: int, pos: int, n_max: int) -> list[int]:
        return []

    def close(self) -> None:
        pass
