"""Small local stand-ins for the GRPO tests: a word-level tokenizer, a tiny Llama built from config, a sampling engine
and a toy task where the right answer is one specific token per prompt (learnable in a few dozen steps)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlvr_envs.core import ListSource, Task, TextEnv, Verdict

WORDS = ["<pad>", "<eos>", "<unk>"] + [f"p{k}" for k in range(4)] + [f"t{k}" for k in range(4)] + list("abcdefgh")


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def make_model(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def make_policy(seed: int = 0, layers: int = 2) -> SimpleNamespace:
    return SimpleNamespace(model=make_model(seed, layers), tokenizer=make_tokenizer(), name="toy",
                           prompt_text=lambda messages: messages[-1]["content"])


class ToyEngine:
    """Token-by-token sampling with full forwards (tiny sequences): logprobs and entropies of the sampled tokens."""

    def __init__(self, policy: SimpleNamespace):
        self.policy = policy

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Decodes from the policy's own tensors: nothing to copy."""

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, sampling, *, seeds=None) -> list[SimpleNamespace]:
        tok, model = self.policy.tokenizer, self.policy.model
        gen = torch.Generator().manual_seed(int(sampling.seed or 0))
        eos = tok.eos_token_id
        out = []
        for i, prompt in enumerate(prompts):  # the n rollouts of a prompt decode together (no padding needed)
            if seeds is not None:  # the engine interface: prompt i's rollouts depend on seeds[i] only
                gen = torch.Generator().manual_seed(int(seeds[i]) % 2**63)
            ids = tok(prompt, add_special_tokens=False)["input_ids"] if isinstance(prompt, str) else list(prompt)
            seq = torch.tensor([ids] * n)
            done = torch.zeros(n, dtype=torch.bool)
            lps, ents, toks = [], [], []
            for _ in range(sampling.max_new_tokens):
                logits = model(input_ids=seq).logits[:, -1].float()
                # the engines' convention: log-probs and entropies of softmax(logits / T), T = 1 when greedy
                logp = torch.log_softmax(logits / (sampling.temperature or 1.0), -1)
                if sampling.temperature == 0:
                    nxt = logp.argmax(-1)
                else:
                    nxt = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]
                lps.append(logp.gather(1, nxt[:, None])[:, 0])
                ents.append(-(logp.exp() * logp).sum(-1))
                toks.append(torch.where(done, torch.full_like(nxt, -1), nxt))
                done = done | (nxt == eos)
                seq = torch.cat([seq, nxt[:, None]], 1)
                if bool(done.all()):
                    break
            for i in range(n):
                resp = [int(t[i]) for t in toks if int(t[i]) >= 0]
                k = len(resp)
                text = tok.decode([t for t in resp if t != eos])
                out.append(SimpleNamespace(prompt_ids=ids, response_ids=resp, text=text,
                                           logprobs=[float(x[i]) for x in lps[:k]],
                                           entropies=[float(x[i]) for x in ents[:k]],
                                           finish_reason="stop" if resp and resp[-1] == eos else "length"))
        return out


def first_token_scorer(task: Task, response: str) -> Verdict:
    words = response.split()
    first = words[0] if words else ""
    ok = first == task.answer
    return Verdict(correct=ok, reward=float(ok), parsed=first or None, format_ok=bool(words))


def make_env(n_tasks: int = 4) -> TextEnv:
    tasks = [Task(id=f"toy-{k}", question=f"p{k % 4}", answer=f"t{k % 4}") for k in range(n_tasks)]
    return TextEnv(ListSource(tasks, name="toy"), first_token_scorer)


def federated_toy_trainer(cfg):
    """A federated client's trainer on the toy task (``trainer_factory="grpo_toys:federated_toy_trainer"``): the toy
    policy and engine, and the toy tasks listed in ``cfg.env_kwargs["ks"]`` (a client's task family)."""
    from agents.grpo.trainer import Trainer

    ks = list(cfg.env_kwargs.get("ks", range(4)))
    tasks = [Task(id=f"toy-{k}", question=f"p{k % 4}", answer=f"t{k % 4}") for k in ks]
    env = TextEnv(ListSource(tasks, name="toy"), first_token_scorer)
    policy = make_policy()
    return Trainer(cfg, policy=policy, engine=ToyEngine(policy), env=env, eval_env=env)
