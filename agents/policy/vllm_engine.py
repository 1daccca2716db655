"""The ``vllm`` backend: the same ``generate`` interface over ``vllm.LLM`` (GPU machines; ``pip install vllm``).

Prompts go in as token ids (``{"prompt_token_ids": [...]}``) so both backends see identical inputs; vLLM's prefix
caching shares a group's prompt. Each prompt gets its own ``vllm.SamplingParams(n=n, seed=s)`` so per-prompt seeds
(the harness's per-sample seeds) behave as in the ``hf`` backend (same seeds -> same samples within a backend; the
two backends' random streams differ). vLLM's parallel sampling gives child ``j`` of such a request the seed ``s + j``,
and that is the seed each ``Rollout`` records (greedy requests carry none).

Logprobs: we ask for ``logprobs_mode="processed_logprobs"`` when the installed vLLM has it (>= 0.10.2, read from the
package metadata): the sampled token's log-probability after temperature (and top-p) processing. With ``top_p == 1``
that is exactly the ``hf`` convention (``log_softmax(logits / T)``); with ``top_p < 1`` vLLM renormalizes over the
nucleus, so values are larger than hf's. Older vLLM reports raw (``T = 1``) logprobs; ``describe()["logprobs"]`` says
which. Entropies are ``None``: vLLM does not return full distributions (the GRPO trainer recomputes them).
Weights: the engine loads the policy's directory (SmolLM2's converted safetensors copy; ``tiny`` and in-memory models
are saved to a temporary directory first). :meth:`VLLMEngine.sync_weights` (the trainer calls it after every update)
saves the current weights and rebuilds the ``LLM`` from them: correct but slow (seconds per step for small models).
"""

from __future__ import annotations

import gc
import importlib.metadata
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version

from agents.policy.engine import Rollout, RolloutEngine, SamplingParams, encode_prompts, rollout_seeds

FINISH_MAP = {"stop": "stop", "length": "length", "abort": "length"}
LOGPROBS_MODE_SINCE = (0, 10, 2)  # the first vLLM release whose LLM(...) takes logprobs_mode="processed_logprobs"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the 'vllm' backend needs the vllm package and a CUDA GPU: `pip install vllm` (or use backend='hf')"
        ) from e
    return vllm


def installed_vllm_version() -> Version:
    return Version(importlib.metadata.version("vllm"))


def supports_logprobs_mode(version: Version) -> bool:
    # By release number, so that 0.10.2 release candidates and dev builds count as 0.10.2.
    return version.release >= LOGPROBS_MODE_SINCE


def parallel_sampling_seeds(seed: int | None, n: int) -> list[int | None]:
    """The seeds vLLM samples the ``n`` children of one request with: ``seed + j`` for child ``j`` (its
    ``ParentRequest`` copies the request's ``SamplingParams`` per child); none without a seed."""
    return [None] * n if seed is None else [seed + j for j in range(n)]


def sampling_kwargs(sampling: SamplingParams, n: int, seed: int | None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` equivalent to our ``SamplingParams`` for one prompt."""
    return dict(
        n=n,
        temperature=float(sampling.temperature),
        top_p=float(sampling.top_p),
        max_tokens=int(sampling.max_new_tokens),
        seed=None if seed is None else int(seed) % (2**63),
        stop=list(sampling.stop),
        logprobs=0,  # the sampled token's logprob only
        skip_special_tokens=True,
        include_stop_str_in_output=False,
    )


def _sampled_logprob(position: Any, token: int) -> float:
    """One entry of ``CompletionOutput.logprobs``: a dict ``{token_id: Logprob(logprob=...)}`` (or a float)."""
    entry = position[token] if isinstance(position, dict) else position
    value = getattr(entry, "logprob", entry)
    return float(value)


def rollouts_from_outputs(request_outputs: Sequence[Any], n: int, seeds: list[list[int | None]]) -> list[Rollout]:
    """Convert ``vllm.RequestOutput``s (one per prompt, in order) into prompt-major ``Rollout``s."""
    rollouts: list[Rollout] = []
    for i, req in enumerate(request_outputs):
        outs = sorted(req.outputs, key=lambda o: getattr(o, "index", 0))
        if len(outs) != n:
            raise RuntimeError(f"vLLM returned {len(outs)} completions for prompt {i}, expected {n}")
        for j, out in enumerate(outs):
            ids = [int(t) for t in out.token_ids]
            lps = [] if out.logprobs is None else [_sampled_logprob(pos, t) for pos, t in zip(out.logprobs, ids)]
            if out.logprobs is not None and len(lps) != len(ids):
                raise RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens")
            reason = FINISH_MAP.get(out.finish_reason or "length", "length")
            rollouts.append(Rollout(list(req.prompt_token_ids), ids, out.text, lps, None, reason, seed=seeds[i][j],
                                    meta={"stop_reason": out.stop_reason} if out.stop_reason is not None else {}))
    return rollouts


class VLLMEngine(RolloutEngine):
    backend = "vllm"

    def __init__(self, policy: Any, *, gpu_memory_utilization: float = 0.5, dtype: str = "auto",
                 max_model_len: int | None = None, **llm_kwargs: Any) -> None:
        self._vllm = _import_vllm()
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.llm_kwargs = dict(gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
                               enable_prefix_caching=True, **llm_kwargs)
        if max_model_len is not None:
            self.llm_kwargs["max_model_len"] = max_model_len
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.version = installed_vllm_version()
        # Older vLLM has no logprobs_mode and reports log-probs of the raw logits (T = 1).
        self.logprobs_mode = "processed_logprobs" if supports_logprobs_mode(self.version) else "raw_logprobs"
        self.llm = self._build()

    def _model_dir(self) -> str:
        """A directory vLLM can load: the policy's own when it has one and is unchanged, else a fresh save."""
        path = getattr(self.policy, "info", {}).get("path")
        if path and Path(path, "config.json").is_file() and not getattr(self, "_force_save", False):
            return str(path)
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="rlvr_vllm_")
        self.policy.model.save_pretrained(self._tmp.name)
        self.tokenizer.save_pretrained(self._tmp.name)
        return self._tmp.name

    def _build(self) -> Any:
        model_dir = self._model_dir()
        mode = {"logprobs_mode": self.logprobs_mode} if self.logprobs_mode == "processed_logprobs" else {}
        return self._vllm.LLM(model=model_dir, tokenizer=model_dir, **mode, **self.llm_kwargs)

    def reload(self) -> None:
        """Rebuild the engine from the policy's current (e.g. trained) weights."""
        self._force_save = True
        del self.llm
        gc.collect()  # the old engine's GPU memory must be free before the new one reserves its share
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm = self._build()

    def sync_weights(self, model: Any) -> None:
        """Sample from ``model``'s current weights from now on (the trainer calls this after every update)."""
        if model is not self.policy.model:
            raise ValueError("VLLMEngine serves its policy's model; sync_weights got a different model")
        self.reload()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "vllm_version": str(self.version), "logprobs": self.logprobs_mode}

    def generate(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], n: int, sampling: SamplingParams,
        *, seeds: Sequence[int] | None = None,
    ) -> list[Rollout]:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        # One seeded request per prompt; vLLM derives its n children's seeds from it (parallel_sampling_seeds), so the
        # rollouts record those, not ours.
        request_seeds = [s[0] for s in rollout_seeds(len(prompt_ids), 1, sampling, seeds)]
        kwargs = [sampling_kwargs(sampling, n, None if sampling.greedy else s) for s in request_seeds]
        params = [self._vllm.SamplingParams(**kw) for kw in kwargs]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
        return rollouts_from_outputs(outputs, n, [parallel_sampling_seeds(kw["seed"], n) for kw in kwargs])
