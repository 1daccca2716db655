"""The ``vllm`` backend: the same ``generate`` interface over ``vllm.LLM`` (GPU machines; ``pip install vllm``).

Prompts go in as token ids (``{"prompt_token_ids": [...]}``) so both backends see identical inputs; vLLM's prefix
caching shares a group's prompt. Each prompt gets its own ``vllm.SamplingParams(n=n, seed=...)`` so per-prompt seeds
(the harness's per-sample seeds) behave as in the ``hf`` backend (same seeds -> same samples within a backend; the
two backends' random streams differ).

Logprobs: we ask for ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2): the sampled token's log-probability
after temperature (and top-p) processing. With ``top_p == 1`` that is exactly the ``hf`` convention
(``log_softmax(logits / T)``); with ``top_p < 1`` vLLM renormalizes over the nucleus, so values are larger than hf's.
Older vLLM without ``logprobs_mode`` reports raw (``T = 1``) logprobs; ``describe()["logprobs"]`` says which.
Entropies are ``None``: vLLM does not return full distributions (a trainer recomputes them in its forward pass).
Weights: the engine loads the policy's directory (SmolLM2's converted safetensors copy; ``tiny`` and in-memory models
are saved to a temporary directory first). After training, call :meth:`VLLMEngine.reload` to pick up new weights.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.policy.engine import Rollout, RolloutEngine, SamplingParams, encode_prompts, rollout_seeds

FINISH_MAP = {"stop": "stop", "length": "length", "abort": "length"}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the 'vllm' backend needs the vllm package and a CUDA GPU: `pip install vllm` (or use backend='hf')"
        ) from e
    return vllm


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


def rollouts_from_outputs(request_outputs: Sequence[Any], n: int, seeds: list[list[int]]) -> list[Rollout]:
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
        self.logprobs_mode = "processed_logprobs"
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
        try:
            return self._vllm.LLM(model=model_dir, tokenizer=model_dir, logprobs_mode=self.logprobs_mode,
                                  **self.llm_kwargs)
        except TypeError:  # vLLM before logprobs_mode existed: logprobs are raw (T = 1)
            self.logprobs_mode = "raw_logprobs"
            return self._vllm.LLM(model=model_dir, tokenizer=model_dir, **self.llm_kwargs)

    def reload(self) -> None:
        """Rebuild the engine from the policy's current (e.g. trained) weights."""
        self._force_save = True
        del self.llm
        self.llm = self._build()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "vllm_version": getattr(self._vllm, "__version__", "?"),
                "logprobs": self.logprobs_mode}

    def generate(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], n: int, sampling: SamplingParams,
        *, seeds: Sequence[int] | None = None,
    ) -> list[Rollout]:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        row_seeds = rollout_seeds(len(prompt_ids), n, sampling, seeds)
        # vLLM derives a seeded request's n samples from its one seed: we pass sample 0's seed (rollout.seed records it).
        params = [self._vllm.SamplingParams(**sampling_kwargs(sampling, n, None if sampling.greedy else s[0]))
                  for s in row_seeds]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
        return rollouts_from_outputs(outputs, n, row_seeds)
