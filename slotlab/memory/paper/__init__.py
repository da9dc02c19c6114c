"""The paper memory: llama.cpp's KV memory on paper — token ids and positions per cell, no tensors.

`PaperMemory` implements the `Memory` interface (base.py) for the simulator: it computes everything
the server's decisions depend on the way the pinned llama.cpp does, from a `ModelProfile` (a GGUF
header or a JSON profile, profile.py), so an 8B or 70B model can be "served" on a laptop:

* state sizes exactly as `llama_state_seq_get_size_ext` reports them, full and PARTIAL_ONLY, for
  the target and the draft context (src/llama-context.cpp `state_seq_get_size`: an 8-byte header,
  then each cache's `state_write`: stream count, per-stream cell count, per cell position / seq
  count / seq id (+ a 12-byte extension with M-RoPE), `v_trans`, layer count, and per layer the
  K (and V) type, row size and rows of the cells; src/llama-kv-cache.cpp);
* the cell pool: llama.cpp's `find_slot` (a ring scan from the stream's head that may reuse cells
  the sliding window masks), `apply_ubatch` (and its purge of the older positions of a sequence whose
  cell was reused), the ubatch splits (`split_simple` / `split_equal`), one pool of n_ctx cells with
  `--kv-unified`, one stream of n_ctx_seq cells per slot otherwise — so `decode` returns 1 ("failed to
  find free space") exactly when the real context does, and `pos_min` after a decode is the real one;
* the iSWA pair of caches of a SWA model (Gemma 2/3, gpt-oss, ...): a full cache for the full-attention
  layers and a window cache of `pad(n_swa * (n_seq if unified else 1) + n_ubatch, 256)` cells (the
  whole context with `--swa-full`); PARTIAL_ONLY writes the window cache only; `pos_min` / `pos_max`
  are the window cache's; the state holds only the cells the window does not mask;
* `seq_rm` (type PART), `seq_add` / `can_shift` (false for a SWA model unless both caches have the
  same size, i.e. `--swa-full` or a context no larger than the window cache), the position checks of
  `llama_batch_allocr` (decode returns -1 on a non-consecutive batch).

Layout only matters in the window cache; the full cache (and a non-SWA model's cache) is modelled by
its cell counts and sorted positions per sequence, which is observably the same (every free cell is
usable there, and a state's size does not depend on cell order), and O(tokens) per decode.

State blobs are `PaperBlob`s: numpy uint8 arrays whose `len()` / `.nbytes` are the real size but which
occupy no memory (a zero-stride view of one byte) and carry the cells as a compact payload. They pass
through the RAM prompt cache and checkpoints like real buffers (`.copy()` is cheap). Give the engine
`allocate=paper_allocate` (or a `PaperAllocator`) so the cache's entries are PaperBlobs too; with the
default numpy allocator `state_get(out=...)` writes the real llama.cpp byte format (tensor data left
zero) into the buffer, which `state_set` reads back — a real context can also load those bytes.

Slot files (`save_file`) are real llama.cpp sequence-state files (magic, version, token payload, state)
with the tensor data written as holes (sparse files): the byte count and file size are the real ones.

* the recurrent memory of Mamba / RWKV-style models and the recurrent part of a hybrid one (Qwen3.5,
  Qwen3-Next, Granite 4.0 H, Nemotron-H, LFM2, Falcon-H1, Jamba): one state a sequence, r / s rows
  sized from the header's ssm / conv / group (or short-convolution) hyperparameters as
  llama-memory-recurrent allocates them; `seq_rm` refuses a partial cut of a state's end (the
  server's seq_rm FULL); a hybrid memory reports the larger of its parts' `pos_min` and the smaller
  of their `pos_max`; its PARTIAL_ONLY state (a checkpoint) is the recurrent part, plus the window
  cache when the attention part is an iSWA pair (lfm2 with a window). recurrent.py.

Not modelled: cells shared by several sequences (`seq_cp` inside one stream), the contents of the
K/V tensors, the rollback snapshots of `n_rs_seq` > 0 (llama-server sets it only for MTP / EAGLE3 /
DFlash drafts), the memories of llama_memory_hybrid_idx and the DeepSeek-4 caches (the profile names
what it lacks: `ModelProfile.unsized`). The sampler and the draft model produce placeholder tokens
(see `PaperVocab`).

Usage (what `slotlab simulate` does)::

    params = ServerParams.from_args("-m llama-70b.gguf -np 4 -c 131072 --cache-ram 65536")
    mem = PaperMemory.from_params(params)            # reads the GGUF header only
    eng = Engine(params, memory=mem, allocate=PaperAllocator(limit_bytes=None))
    t = eng.submit(token_ids, n_predict=64)          # token ids: there is no tokenizer
    eng.run_until(lambda: t.done)

The package, one concept a module (each imports only those above it):

| module | what |
|---|---|
| format.py | the state byte format: cache specs, the writer and the parser of a cache's part |
| blob.py | `PaperBlob` (real size, no bytes), its `PaperState` payload, `PaperAllocator` |
| cells.py | the cells of a KV cache without a window: `CountCache` (counts and per-sequence positions) |
| window.py | the cells of a sliding-window cache: `CellCache` (the layout, find_slot and the purges) |
| recurrent.py | `RecurrentCache`: a recurrent memory's one state a sequence |
| context.py | `PaperContext`: one llama_context's memory (KV, iSWA, recurrent, hybrid), decode, splits, state |
| vocab.py | `PaperVocab` and `PaperSampler`: opaque ids and placeholder tokens |
| memory.py | `PaperMemory` (the `Memory` interface) and `paper_sizes` |"""

from slotlab.memory.paper.blob import PaperAllocator, PaperBlob, PaperState, paper_allocate
from slotlab.memory.paper.memory import PaperMemory, paper_sizes
from slotlab.memory.paper.vocab import PaperSampler, PaperVocab

__all__ = ["PaperAllocator", "PaperBlob", "PaperMemory", "PaperSampler", "PaperState", "PaperVocab", "paper_allocate",
           "paper_sizes"]
