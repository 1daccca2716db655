"""``micro-countdown``: a few-million-parameter Llama warm-started on solver-written Countdown search traces.

The micro lane's policy (see ``agents/lanes/micro.toml``): small enough that a GRPO step takes about a second on two
CPU cores, trained well enough that RL has signal on both sides (held-out greedy accuracy well inside (0, 1), and
sampled answers that beat greedy ones at pass@k). It is built at first use and cached:

1. Tasks come from ``rlvr/Countdown-v0``'s own generator with the lane's ranges, on a ``seed_base`` stream of their own
   (the lane trains on stream 0 and evaluates on stream 1, so warm-start tasks are neither).
2. Each task gets one search trace from ``countdown_traces.write_trace`` (seeded per task).
3. Supervised training on the response tokens only (AdamW, linear warm-up then linear decay), a fixed number of steps.
   With ``mode_traces=1`` each task's trace is written in a mode drawn uniformly from NoThink / Short / Long
   (``countdown_traces.write_mode_trace``, markers of ``rlvr/Modes-v0``), independently of the task: the policy starts
   every response with a marker and has no preference among modes for RL to start from (the micro lane's modes
   comparison, ``agents/methods/modes.py``).
4. The model and tokenizer are saved under ``$RLVR_CACHE_DIR/models/micro-countdown-<key>/``, where ``key`` hashes the
   config and the source of this file and of the trace writer: change either and the next load rebuilds.

The tokenizer is word-level and lossless for printable ASCII: integers 0..999 are single tokens, the prompt's words
are single tokens, a preceding space is folded into the token (`` 16``), and anything else falls back to single
characters. So a trace line costs about ten tokens.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

NAME = "micro-countdown"
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
# Words of rlvr/Countdown-v0's question and default template: one token each (others fall back to letters).
_WORDS = ("Using the numbers create an equation that equals You can use basic arithmetic operations and each number "
          "must be used exactly once Show your work then give only final expression without target in tags for "
          "example answer nothink short long").split()  # the last three: rlvr/Modes-v0's markers are "/" + word
_PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@dataclass(frozen=True)
class MicroConfig:
    # the task distribution: the micro lane's env kwargs must match (agents/lanes/micro.toml)
    min_numbers: int = 3
    max_numbers: int = 3
    min_number: int = 1
    max_number: int = 9
    min_target: int = 2
    max_target: int = 40
    data_seed_base: int = 1000
    trace_noise: float = 0.6
    mode_traces: int = 0  # 1: each trace in a uniformly drawn NoThink / Short / Long mode, marker first
    # the model
    hidden_size: int = 192
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 6
    # supervised warm start
    steps: int = 500
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    seed: int = 0

    def key(self) -> str:
        """Hash of the config and of the code that turns it into weights."""
        from agents.policy import countdown_traces

        h = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        for module in (countdown_traces, inspect.getmodule(MicroConfig)):
            h.update(inspect.getsource(module).encode())
        h.update(f"torch={torch.__version__.split('+')[0]}".encode())
        return h.hexdigest()[:16]


def micro_tokenizer() -> Any:
    """Word-level, lossless on printable ASCII (see the module docstring); ChatML specials, ``<|im_end|>`` = EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Longest first (the regex alternation must try a word before its prefixes), ties by the word itself: a set's
    # order changes with PYTHONHASHSEED, and the vocabulary's ids (so the initial weights' meaning) must not.
    words = sorted(dict.fromkeys(_WORDS), key=lambda w: (-len(w), w))
    punct = [c for c in string.punctuation]
    pieces: list[str] = []
    for space in ("", " "):
        pieces += [f"{space}{n}" for n in range(1000)] + [space + w for w in words]
        pieces += [space + c for c in string.ascii_letters] + [space + c for c in punct]
    pieces += ["<answer>", " <answer>", "</answer>", " ", "\n", "\t"]
    vocab = {tok: i for i, tok in enumerate(_SPECIALS + list(dict.fromkeys(pieces)))}
    alternatives = "|".join(w for w in words)
    # integers as written (no leading zero: "05" is "0", "5"), at most three digits a token
    pattern = (r" ?<answer>|</answer>| ?(?:0|[1-9]\d{0,2})| ?(?:" + alternatives + r")\b| ?[A-Za-z]| ?[^\sA-Za-z0-9]|\s")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.add_special_tokens(_SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<unk>")
    fast.chat_template = _PLAIN_TEMPLATE
    return fast


def micro_model(tokenizer: Any, cfg: MicroConfig) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=1024, tie_word_embeddings=True, initializer_range=0.02,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return LlamaForCausalLM(config)


def env_kwargs(cfg: MicroConfig) -> dict[str, Any]:
    """``rlvr/Countdown-v0`` kwargs of the distribution the policy was warm-started on (prompt = bare question)."""
    return {"min_numbers": cfg.min_numbers, "max_numbers": cfg.max_numbers, "min_number": cfg.min_number,
            "max_number": cfg.max_number, "min_target": cfg.min_target, "max_target": cfg.max_target,
            "prompt_template": "{question}"}


def warmstart_examples(cfg: MicroConfig, tokenizer: Any, n: int) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt ids, response ids + EOS) pairs: task ``i`` of the warm-start stream with its seeded trace."""
    from agents.policy.countdown_traces import TRACE_MODES, write_mode_trace, write_trace
    from rlvr_envs.tasks.countdown import CountdownSource

    if cfg.mode_traces not in (0, 1):
        raise ValueError(f"mode_traces must be 0 or 1, got {cfg.mode_traces}")

    source = CountdownSource(**{k: v for k, v in env_kwargs(cfg).items() if k != "prompt_template"},
                             seed_base=cfg.data_seed_base)
    out = []
    for i in range(n):
        task = source.task(i)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": task.question}], tokenize=False,
                                               add_generation_prompt=True)
        rng = np.random.default_rng((cfg.seed, i))
        if cfg.mode_traces:
            mode = TRACE_MODES[int(rng.integers(len(TRACE_MODES)))]
            trace = write_mode_trace(task.metadata["numbers"], int(task.answer), rng, mode, noise=cfg.trace_noise)
        else:
            trace = write_trace(task.metadata["numbers"], int(task.answer), rng, noise=cfg.trace_noise)
        out.append((tokenizer(prompt, add_special_tokens=False)["input_ids"],
                    tokenizer(trace, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]))
    return out


def _lr_at(step: int, cfg: MicroConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * max(0.0, (cfg.steps - step) / max(1, cfg.steps - cfg.warmup_steps))


def warm_start(cfg: MicroConfig, *, progress: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """Build and train the policy; returns (model, tokenizer, report). Deterministic for ``cfg`` on one machine."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    tokenizer = micro_tokenizer()
    model = micro_model(tokenizer, cfg)
    examples = warmstart_examples(cfg, tokenizer, cfg.steps * cfg.batch_size)
    order = np.random.default_rng(cfg.seed).permutation(len(examples))
    # Sort each window of 16 batches by length so that a batch pads little (about a third less work per step).
    window = 16 * cfg.batch_size
    for start in range(0, len(order), window):
        part = order[start:start + window]
        order[start:start + window] = part[np.argsort([len(examples[k][1]) for k in part], kind="stable")]
    batches = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    batches = [batches[int(k)] for k in np.random.default_rng(cfg.seed + 1).permutation(len(batches))]
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98), fused=True)
    pad = tokenizer.pad_token_id
    losses: list[float] = []
    model.train()
    bar = tqdm(range(cfg.steps), desc=f"warm start {NAME}", unit="step", disable=not progress)
    for step in bar:
        rows = [examples[int(k)] for k in batches[step]]
        width = max(len(p) + len(r) for p, r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, r) in enumerate(rows):
            ids[i, :len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
            mask[i, :len(p) + len(r)] = 1
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-10:]):.3f}")
    bar.close()
    model.eval()
    report = {"config": asdict(cfg), "key": cfg.key(), "wall_s": round(time.perf_counter() - t0, 1),
              "final_loss": float(np.mean(losses[-20:])), "loss_every_10": [round(x, 4) for x in losses[::10]],
              "n_params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}
    return model, tokenizer, report


def micro_dir(cfg: MicroConfig) -> Path:
    from agents.policy.models import cache_dir

    return cache_dir() / "models" / f"{NAME}-{cfg.key()}"


def ensure_micro(cfg: MicroConfig | None = None, *, progress: bool = True) -> Path:
    """The cached warm-started model directory for ``cfg``, training it first if absent (file-locked, atomic)."""
    from agents.policy.models import cached_build

    cfg = cfg or MicroConfig()
    return cached_build(micro_dir(cfg), lambda: warm_start(cfg, progress=progress))


def parse_name(name: str) -> MicroConfig | None:
    """``micro-countdown`` or ``micro-countdown@key=value,...`` (config overrides, e.g. ``@steps=20``) -> config."""
    from agents.policy.models import parse_spec

    return parse_spec(name, NAME, MicroConfig())
