"""The engine's generation loop and request checks (given code, not copied to assignments/).

    class GPT2Engine(Generation): ...       # engine.py: every engine, yours and the reference, inherits it

:class:`Generation` holds what a GPT-2 engine needs around its prefill and decode step to serve
requests: padding prompts of different lengths and checking their token ids, the sampling and
end-of-sequence buffers a captured step reads, the loop of generate() and stream(), and the CUDA
graphs that replay a decode step (one per batch size and kind of step) and a short prompt's prefill.
It calls the engine's ``prefill``, ``_prompt_forward``, ``decode_step`` and ``_next_token``.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .sampling import SamplingParams


def _check_integer(ids: torch.Tensor, name: str) -> None:
    """TypeError unless ``ids`` holds integers (bool and floating-point ids are refused, never rounded)."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name}: token ids must be integers, got a tensor of {ids.dtype}")




class Generation:
    """Generation around a GPT-2 engine's prefill and decode step (see the module docstring)."""

    def _init_generation(self, max_batch: int) -> None:
        """The generation state the captured steps read (device buffers: a replay picks up new values)."""
        self._graphs: dict = {}            # decode: (B, mode) -> graph; prefill: ("prefill", B, T)
        self._seed = torch.zeros(1, dtype=torch.long, device=self.device)          # sampling's Philox key
        self._params = SamplingParams().tensor(self.device)                        # temperature, top_k, top_p
        self._done = torch.zeros(max_batch, dtype=torch.bool, device=self.device)  # sequence ended (EOS)
        self._eos = torch.full((self.MAX_EOS,), -1, dtype=torch.long, device=self.device)
        self._pad_id = torch.zeros((), dtype=torch.long, device=self.device)

    GREEDY = (False, False, False, False)
    #: At most this many end-of-sequence ids (transformers takes a list)
    MAX_EOS = 8
    #: generate() looks on the host whether every sequence has ended once per this many steps
    CHECK_EVERY = 8

    def generate(self, prompts, max_new_tokens: int, *, cuda_graph: bool | None = None, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 generator: torch.Generator | None = None, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, check_every: int | None = None) -> torch.Tensor:
        """Generate up to ``max_new_tokens`` tokens per prompt: int64 [B, n] on the device, n <= max_new_tokens.

        prompts: a list of 1-D token-id sequences (lists or tensors, lengths may differ) or an
        int64 [B, T] tensor (all length T). cuda_graph (default: on a GPU) captures the decode
        step once per batch size and kind of step and replays it, and replays short prompts' prefill
        from a graph per (B, padded T); False runs both eagerly (the profile's "before").

        Greedy by default. ``do_sample=True`` draws each token on the GPU (sampling.py, inside the
        captured step) after transformers' filters: ``temperature``, ``top_k`` (0: off), ``top_p``
        (1: off); the random stream is keyed by ``seed`` (or a draw from ``generator``, or from
        torch's global generator) and by each token's sequence and position: same seed, same tokens.

        ``eos_token_id`` (an id or a list): a sequence that produces it has ended; its later tokens
        are ``pad_token_id`` (default: the first eos id), and generation returns once every sequence
        has ended (looked at on the host every ``check_every`` steps, default CHECK_EVERY: a sync each
        time), n = the longest sequence's length, EOS included, as transformers returns it.
        """
        b, use_graph, mode, tok = self._begin(prompts, max_new_tokens, cuda_graph, do_sample, temperature, top_k,
                                              top_p, seed, generator, eos_token_id, pad_token_id)
        every = self.CHECK_EVERY if check_every is None else check_every
        if every < 1:
            raise ValueError(f"check_every: expected >= 1, got {every}")
        out = torch.empty(b, max_new_tokens, dtype=torch.long, device=self.device)
        out[:, 0] = tok
        n = max_new_tokens
        for i in range(1, max_new_tokens):
            if mode[1] and i % every == 0 and bool(self._done[:b].all()):   # a host sync, every few steps
                n = i
                break
            tok = self._step(i, b, use_graph, mode, tok)
            out[:, i] = tok
        out = out[:, :n]
        if mode[1]:              # cut the steps run after the last sequence ended (one sync)
            hit = (out[:, :, None] == self._eos).any(-1)
            ends = torch.where(hit.any(1), hit.int().argmax(1) + 1, n)
            out = out[:, :int(ends.max())]
        return out

    def stream(self, prompts, max_new_tokens: int, **options) -> Iterator[torch.Tensor]:
        """generate() one step at a time: yields each step's new tokens, int64 [B] on the host, as soon
        as they exist (a host sync per step), until max_new_tokens or every sequence has ended. The same
        options and the same tokens as :meth:`generate` (``check_every`` does not apply). The prompts are
        checked and prefilled at the call; the engine's cache is the stream's until it ends."""
        options.pop("check_every", None)
        b, use_graph, mode, tok = self._begin(prompts, max_new_tokens, options.pop("cuda_graph", None), **options)
        return self._stream(b, use_graph, mode, tok, max_new_tokens)

    def _stream(self, b, use_graph, mode, tok, max_new_tokens) -> Iterator[torch.Tensor]:
        eos = set(self._eos.tolist()) - {-1}
        ended = [False] * b
        for i in range(max_new_tokens):
            if i:
                tok = self._step(i, b, use_graph, mode, tok)
            host = tok.cpu()
            yield host
            ended = [e or t in eos for e, t in zip(ended, host.tolist())]
            if eos and all(ended):
                return

    def _begin(self, prompts, max_new_tokens, cuda_graph=None, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
               seed=None, generator=None, eos_token_id=None, pad_token_id=None):
        """Check the request, set the sampling and EOS buffers, prefill: (B, use_graph, mode, first tokens)."""
        ids, lengths = self.pad(prompts)
        b = len(lengths)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        if max(lengths) + max_new_tokens - 1 > self.max_seq_len:
            raise ValueError(f"a prompt of {max(lengths)} tokens + {max_new_tokens} new ones needs "
                             f"{max(lengths) + max_new_tokens - 1} cache positions; max_seq_len is {self.max_seq_len}")
        use_graph = (self.device.type == "cuda") if cuda_graph is None else cuda_graph
        if use_graph and self.device.type != "cuda":
            raise ValueError(f"generate(cuda_graph=True): CUDA graphs need a CUDA device; this engine is on {self.device}")
        if do_sample:
            params = SamplingParams(temperature, top_k, top_p)       # checks them
            if generator is not None:
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            elif seed is None:
                seed = int(torch.randint(0, 2**62, (1,)))
            elif not isinstance(seed, int):
                raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
            self._params.copy_(params.tensor("cpu"))
            self._seed.fill_(seed)
        eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if eos_token_id is not None:
            if not eos or len(eos) > self.MAX_EOS or not all(isinstance(e, int) and 0 <= e < self.vocab_size for e in eos):
                raise ValueError(f"eos_token_id: expected 1 to {self.MAX_EOS} ids in [0, {self.vocab_size}), got {eos_token_id!r}")
            pad = eos[0] if pad_token_id is None else pad_token_id
            if not isinstance(pad, int) or not 0 <= pad < self.vocab_size:
                raise ValueError(f"pad_token_id: expected an id in [0, {self.vocab_size}), got {pad!r}")
            self._eos.copy_(torch.tensor(eos + [-1] * (self.MAX_EOS - len(eos))))
            self._pad_id.fill_(pad)
            self._done[:b] = False
        else:
            self._eos.fill_(-1)
        mode = self.mode(do_sample, eos_token_id is not None, top_k, top_p)
        tok = self._next_token(self.prefill(ids, lengths, cuda_graph=use_graph), b, mode)
        return b, use_graph, mode, tok

    def mode(self, do_sample: bool, eos: bool, top_k: int = 0, top_p: float = 1.0) -> tuple[bool, bool, bool, bool]:
        """What a generate() call's decode graph depends on (its key is (B, mode)): (sampled, with EOS, and on
        the tuned path: its sampler's kernels C+D (top-p without top-k), its wide top-k; False on the core)."""
        do_sample = bool(do_sample)
        tuned = getattr(self, "tuned", None)
        if tuned is None:
            return (do_sample, bool(eos), False, False)
        return (do_sample, bool(eos), do_sample and top_p < 1 and not 0 < top_k < self.vocab_size,
                do_sample and top_k > tuned.wide_top_k)

    def _step(self, i: int, b: int, use_graph: bool, mode: tuple, tok: torch.Tensor) -> torch.Tensor:
        """Decode step i (>= 1) of a generation: the next tokens [B] after ``tok``."""
        if use_graph and ((b, mode) in self._graphs or i > 1):   # step 1 ran eagerly: kernels compiled, tuned
            tok = self._replay(b, mode, tok)
        else:
            tok = self._next_token(self.decode_step(tok), b, mode)
        self.cache.host_lengths[:b] = [n + 1 for n in self.cache.host_lengths[:b]]
        return tok

    def pad(self, prompts) -> tuple[torch.Tensor, list[int]]:
        """Right-pad prompts to [B, T] int64 on the device; returns (ids, lengths).

        Token ids must be integers (TypeError otherwise: a float id is never rounded silently); a tensor
        on another device is moved to the engine's. Their range is checked by :meth:`prefill`."""
        if isinstance(prompts, torch.Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"prompts: expected [B, T] token ids, got shape {tuple(prompts.shape)}")
            _check_integer(prompts, "prompts")
            return prompts.to(self.device, torch.long), [prompts.shape[1]] * prompts.shape[0]
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts: expected a list of token-id sequences or an int64 [B, T] tensor, "
                            f"got {type(prompts).__name__}")
        seqs = []
        for i, p in enumerate(prompts):
            if isinstance(p, (str, bytes)):
                raise TypeError(f"prompts[{i}]: expected token ids (integers), got a {type(p).__name__}: tokenize first")
            try:
                s = p if isinstance(p, torch.Tensor) else torch.as_tensor(p)
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"prompts[{i}]: expected a sequence of token ids (integers), got {p!r:.80}") from e
            if s.numel() == 0:
                raise ValueError("prompts: expected one or more non-empty token sequences")
            _check_integer(s, f"prompts[{i}]")
            seqs.append(s.flatten().to("cpu", torch.long))
        if not seqs:
            raise ValueError("prompts: expected one or more non-empty token sequences")
        t = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), t, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = s
        return ids.to(self.device), [len(s) for s in seqs]

    def _check_ids(self, ids, lengths) -> tuple[int, int]:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 2:
            raise TypeError(f"ids: expected an int64 [B, T] tensor, got {getattr(ids, 'dtype', type(ids))} "
                            f"{tuple(getattr(ids, 'shape', ()))}")
        b, t = ids.shape
        if ids.device != self.device:
            raise ValueError(f"ids: expected a tensor on {self.device}, got one on {ids.device}")
        if not 1 <= b <= self.max_batch:
            raise ValueError(f"batch of {b}: the cache holds 1 to max_batch={self.max_batch} sequences")
        if not 1 <= t <= self.max_seq_len:
            raise ValueError(f"prompt length {t}: expected 1 to max_seq_len={self.max_seq_len}")
        if lengths is not None and (len(lengths) != b or not all(1 <= n <= t for n in lengths)):
            raise ValueError(f"lengths: expected {b} lengths in 1..{t}, got {list(lengths)}")
        self._check_token_range(ids)
        return b, t

    def _check_token_range(self, ids: torch.Tensor) -> None:
        """ValueError unless every id (padding included) lies in [0, vocab_size), before any kernel runs:
        an id out of range would make the embedding read out of bounds (on a GPU: a device-side assert
        that kills the process's CUDA context). One reduction and one host sync (.tolist()) per call;
        the search for the culprit runs only when there is one."""
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()
        if lo >= 0 and hi < self.vocab_size:
            return
        bad = ((ids < 0) | (ids >= self.vocab_size)).nonzero()[0].tolist()
        raise ValueError(f"token id {ids[bad[0], bad[1]].item()} in sequence {bad[0]} at position {bad[1]} is out of "
                         f"range: expected 0 <= id < vocab_size={self.vocab_size}")

    def _replay(self, b: int, mode: tuple, tok: torch.Tensor) -> torch.Tensor:
        """One decode step and its token choice by CUDA-graph replay (captured on first use for batch size
        b and mode = (sampled, with EOS, with top-p, wide top-k))."""
        key = (b, mode)
        if key not in self._graphs:
            static_tok = tok.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):              # records the kernels; runs nothing
                nxt = self._next_token(self.decode_step(static_tok), b, mode)
                static_tok.copy_(nxt)                  # the next replay starts from this token
            self._graphs[key] = (graph, static_tok)
        graph, static_tok = self._graphs[key]
        if tok is not static_tok:                      # after the first replay it already is
            static_tok.copy_(tok)
        graph.replay()
        return static_tok

    #: Prompts of up to this many tokens (B · padded T) are prefilled by CUDA-graph replay.
    GRAPH_PREFILL_TOKENS = 4096

    def _bucket(self, t: int) -> int:
        """Prompt length padded to a multiple of 64 (fewer graphs), at most max_seq_len."""
        return min(-(-t // 64) * 64, self.max_seq_len)

    def _prefill_graphed(self, ids: torch.Tensor, b: int, t: int) -> torch.Tensor:
        """Prefill by CUDA-graph replay, one graph per (B, padded T).

        A short prompt's prefill is ~10 kernels per block that each run for microseconds:
        issuing them from Python costs more than running them (lecture 08 measures it).
        The prompt is right-padded to the bucket's length with token 0: causal attention keeps
        every real token from seeing the padding, and the cache slots the padding writes lie
        past ``lengths`` (decode overwrites them). The first prompt of a bucket runs eagerly
        (compiles, autotunes) and is then captured; later ones copy their ids in and replay.
        """
        tp = self._bucket(t)
        key = ("prefill", b, tp)
        if key not in self._graphs:
            static_ids = torch.zeros(b, tp, dtype=torch.long, device=self.device)
            static_last = torch.zeros(b, dtype=torch.long, device=self.device)
            static_ids[:, :t] = ids
            static_last.copy_(self.cache.lengths[:b])
            static_last -= 1
            out = self._prompt_forward(static_ids, static_last)     # eager: compile and tune first
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self._prompt_forward(static_ids, static_last)
            self._graphs[key] = (graph, static_ids, static_last, static_out)
            return out
        graph, static_ids, static_last, static_out = self._graphs[key]
        static_ids[:, t:] = 0
        static_ids[:, :t] = ids
        static_last.copy_(self.cache.lengths[:b])
        static_last -= 1
        graph.replay()
        return static_out

