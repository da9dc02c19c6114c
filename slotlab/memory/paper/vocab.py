"""Tokens on paper: opaque ids, and placeholders for what the model would generate.

The paper memory has no weights, so "sampling" returns a deterministic placeholder: a hash of the
row's token, its position and the seed (splitmix64), mapped into the top `n_generated` ids below the
end-of-generation id. Equal prompts thus give equal continuations on any slot, and a placeholder
matches no prompt token that uses ids below `gen_lo` (what keeps the RAM cache's and cache-reuse's
prefix matches those of the prompts alone). `PaperVocab.chain` gives a run of them at once, for
the simulator's fast-forward."""

from __future__ import annotations

import numpy as np

__all__ = ["M64", "PaperSampler", "PaperVocab", "mix", "outside"]

M64 = (1 << 64) - 1


def mix(x: int) -> int:
    """splitmix64 finalizer."""
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def outside(t: np.ndarray, n_vocab: int) -> bool:
    """True when an id of `t` (non-empty) is negative or >= n_vocab: the batch check every paper
    decode makes. On int32 ids, one unsigned maximum (a negative id reads as 2**31 or more, above
    any vocabulary) instead of a minimum and a maximum."""
    if t.dtype == np.int32:
        return int(t.view(np.uint32).max()) >= n_vocab
    return bool(t.min() < 0 or t.max() >= n_vocab)


class PaperVocab:
    """Opaque token ids 0..n_vocab-1. Generated tokens are placeholders from the top `n_generated`
    ids (below the end-of-generation id n_vocab-1, which is never generated), so they match no prompt
    token as long as prompts use ids below `gen_lo`. There is no tokenizer: `tokenize` raises —
    submit token ids, or give PaperMemory a real vocabulary (e.g. a loaded `slotlab.llama.Model`)."""

    def __init__(self, n_vocab: int, n_generated: int = 4096):
        if n_vocab < 4:
            raise ValueError(f"n_vocab must be >= 4, got {n_vocab}")
        self.n_vocab = int(n_vocab)
        self.eog = self.n_vocab - 1
        self.n_generated = max(1, min(int(n_generated), self.n_vocab // 4))
        self.gen_lo = self.eog - self.n_generated

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        raise NotImplementedError("the paper memory has no tokenizer: submit token ids (or pass vocab= a real "
                                  "vocabulary, e.g. slotlab.llama.Model)")

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        return b"<%d>" % int(token)

    def detokenize(self, tokens) -> str:
        # one format call (a response's text is made per request, from the slot's list of generated
        # ids): `%d` formats an integer (a numpy one included) as `int()` would, so a list or tuple is
        # formatted as it is, without an int() call per token; what `%d` refuses (a numeric string)
        # goes through int() as before
        if isinstance(tokens, np.ndarray):
            t = tokens.tolist()
        elif type(tokens) is list or type(tokens) is tuple:
            t = tokens
        else:
            t = [int(x) for x in tokens]
        try:
            return ("<%d>" * len(t)) % tuple(t)
        except TypeError:
            return ("<%d>" * len(t)) % tuple(int(x) for x in t)

    def is_eog(self, token: int) -> bool:
        return int(token) == self.eog

    def check_tokens(self, tokens) -> None:
        t = np.asarray(tokens)
        if t.size and outside(t, self.n_vocab):
            bad = t[(t < 0) | (t >= self.n_vocab)][0]
            raise ValueError(f"token id {int(bad)} is outside the vocabulary (0..{self.n_vocab - 1})")

    def generated(self, token: int, pos: int, seed: int) -> int:
        """The placeholder the target "samples" after `token` at `pos` (deterministic)."""
        h = mix(int(token) * 0x9E3779B97F4A7C15 + int(pos) * 0xD1B54A32D192ED03 + int(seed) * 0x8CB92BA72F3D8DD7 + 1)
        return self.gen_lo + h % self.n_generated

    def chain(self, token: int, pos: int, seed: int, k: int, out: list | None = None) -> list[int]:
        """The next `k` placeholders greedy stepping gives after `token` at `pos`: each one is
        `generated(previous, position, seed)` at the next position, so `chain(t, p, s, k)[j]` is what
        the j-th of k decode + sample steps returns. Appended to `out` when given (returned)."""
        # a hot loop (one pass per generated token of a simulation): generated() inlined, the constants
        # as locals, the position term carried from step to step
        M, A, B, C1, C2 = M64, 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
        lo, ng = self.gen_lo, self.n_generated
        out = [] if out is None else out
        app = out.append
        tok = int(token)
        pt = int(pos) * B + int(seed) * 0x8CB92BA72F3D8DD7 + 1
        if ng & (ng - 1) == 0:  # a power of two (4096 for every vocabulary of 16k ids or more)
            # `h % ng` is `h & (ng - 1)`, and the low bits of `x ^ (x >> 31)` only read bits 0..42 of
            # x, which the last `& M` does not change: two big-int operations fewer per token
            mask = ng - 1
            for _ in range(k):
                x = (tok * A + pt) & M
                x = ((x ^ (x >> 30)) * C1) & M
                x = (x ^ (x >> 27)) * C2
                tok = lo + ((x ^ (x >> 31)) & mask)
                app(tok)
                pt += B
            return out
        for _ in range(k):
            x = (tok * A + pt) & M
            x = ((x ^ (x >> 30)) * C1) & M
            x = ((x ^ (x >> 27)) * C2) & M
            tok = lo + (x ^ (x >> 31)) % ng
            app(tok)
            pt += B
        return out


    def chains(self, tokens, positions, seed: int, lengths) -> tuple[np.ndarray, np.ndarray]:
        """Many chains at once: chain i is `chain(tokens[i], positions[i], seed, lengths[i])`, the
        chains laid end to end in one int32 array; returns (that array, each chain's start in it).

        Why: a chain is sequential in its own steps, but independent chains are not, so numpy steps
        them all together (one pass per step of the longest, on the chains still running), in
        uint64 arithmetic, whose wrap-around is the `& M64` of `generated`. The simulator computes
        the placeholders of a whole trace's requests this way before they run (fastforward.py's
        `Prechains`) instead of token by token in Python."""
        ks = np.asarray(lengths, dtype=np.int64)
        n = len(ks)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(ks, out=starts[1:])
        out = np.empty(int(starts[-1]), dtype=np.int32)
        if n == 0 or not len(out):
            return out, starts[:-1]
        order = np.argsort(-ks, kind="stable")  # longest first: the chains still running are a prefix
        ks_o = ks[order]
        dst = starts[:-1][order]
        with np.errstate(over="ignore"):
            tok = np.asarray(tokens, dtype=np.int64)[order].astype(np.uint64)
            pt = (np.asarray(positions, dtype=np.int64)[order].astype(np.uint64) * np.uint64(0xD1B54A32D192ED03)
                  + np.uint64((int(seed) * 0x8CB92BA72F3D8DD7 + 1) & M64))
            A, B = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03)
            C1, C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
            s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
            lo, ng = np.uint64(self.gen_lo), np.uint64(self.n_generated)
            live = n
            for j in range(int(ks_o[0])):
                while live and ks_o[live - 1] <= j:
                    live -= 1
                t, p = tok[:live], pt[:live]
                x = t * A + p
                x ^= x >> s30
                x *= C1
                x ^= x >> s27
                x *= C2
                x ^= x >> s31
                t = lo + x % ng
                tok[:live] = t
                out[dst[:live] + j] = t
                pt[:live] += B
        return out, starts[:-1]


class PaperSampler:
    """The `SlotSampler` of a paper memory: the placeholder after the sampled row's token and position
    (`PaperMemory.sample_row`), with the seed of the request (0 when greedy)."""

    def __init__(self, mem, seed: int):
        self.mem, self.seed = mem, seed

    def sample(self, i: int) -> int:
        return self.mem.sample_row(i, self.seed)

    def close(self) -> None:
        pass
