"""The *reproduced* leaderboard tier: what a board can re-derive when the evaluated policy is loadable here.

Re-verification (``leaderboard.verify_results``) proves each verdict follows from its response; it cannot prove the
responses came from the model the file names, nor that the token counts are the model's. When the file's agent is a
``PolicyAgent`` whose model this machine can load *and* whose weights hash matches the file's, the board checks three
fields more, each recorded on the entry (``evidence``):

- **model**: the named policy's weights hash equals the claimed one (a false name is rejected);
- **responses**: a seeded random sample of records is decoded again with the recorded sampling and engine settings
  and each sample's seed; every response (every turn, for multi-turn envs) must be identical;
- **tokens**: every record's token count is recounted with the policy's tokenizer. The text cannot show special
  tokens the model emitted (an end token, a stray ``<|im_start|>``), which only add to the count, so the recount
  bounds a claim from below (less ``token_slack`` for another tokenization of the same text) and the sampling cap
  (``max_new_tokens`` per turn) bounds it from above; each re-decoded record's count must equal the re-decoded one
  exactly.

The tier is asked for (``rlvr leaderboard submit --reproduce``): decoding is only identical on the same numerics, so a
file from other hardware or an older engine may not reproduce, and a board does not decode every submission. Once
asked for, a policy that cannot be loaded or that contradicts the file rejects the submission. Everything else is
*self-reported*, field by field, and shown so on the page and in ``rlvr leaderboard show``. The sample's seed comes
from the results file's SHA-256, so a submitter cannot pick which records are decoded without changing the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPRODUCED = "reproduced"
SELF_REPORTED = "self-reported"
EVIDENCE_FIELDS = ("model", "responses", "tokens")
DEFAULT_SAMPLE = 8  # records re-decoded per submission
POLICY_AGENT_CLASS = "agents.policy.agent.PolicyAgent"
_TINY = re.compile(r"tiny-seed(\d+)")


def token_slack(recount: int) -> int:
    """How far below the tokenizer's recount a claimed count may sit: the model may have written the same text in
    fewer, longer tokens than the tokenizer's own split (1 token plus 5%)."""
    return 1 + recount // 20


@dataclass
class LoadablePolicy:
    """A policy this machine can decode with, and how to build the agent the results file describes."""

    policy: Any  # .name, .weights_hash, .tokenizer
    make_agent: Callable[[], Any]  # an agent with the recorded sampling and engine settings


# (agent description from a results file) -> a loadable policy, or None when it cannot be loaded here
PolicyResolver = Callable[[Mapping[str, Any]], "LoadablePolicy | None"]


def _policy_name_to_load(model: str) -> tuple[str, int] | None:
    """``load_policy`` arguments for a recorded model name that loads without a download: ``tiny-seed<N>`` (built
    from a config), ``smollm2`` (the bundled GGUF) and local model directories. Other names (Hub ids, trained
    checkpoints named by run) are not loadable by name here."""
    tiny = _TINY.fullmatch(model)
    if tiny:
        return "tiny", int(tiny.group(1))
    if model == "smollm2" or Path(model).is_dir():
        return model, 0
    return None


def resolve_loadable_policy(agent: Mapping[str, Any]) -> LoadablePolicy | None:
    """The default resolver: a ``PolicyAgent`` on the ``hf`` engine whose model name loads here (see
    ``_policy_name_to_load``), with the recorded sampling and engine settings; None otherwise."""
    if agent.get("class") != POLICY_AGENT_CLASS or not isinstance(agent.get("model"), str):
        return None
    engine = agent.get("engine") or {}
    sampling = agent.get("sampling") or {}
    if engine.get("backend") != "hf" or any(engine.get(k) for k in ("speculative", "kv_compression", "sparse_decode")):
        return None  # decoding paths this resolver does not rebuild
    if "precision" not in engine:
        return None  # files from before the engine recorded it cannot say how they were decoded
    spec = _policy_name_to_load(agent["model"])
    if spec is None:
        return None
    try:
        from agents.policy import PolicyAgent, load_policy
        from agents.policy.engine import SamplingParams, make_engine
    except ImportError:  # the [agents] extra is not installed: nothing is loadable
        return None
    name, seed = spec
    try:
        policy = load_policy(name, seed=seed)
    except (OSError, ValueError, ImportError):
        return None
    params = SamplingParams(temperature=float(sampling.get("temperature", 1.0)), top_p=float(sampling.get("top_p", 1.0)),
                            max_new_tokens=int(sampling.get("max_new_tokens", 256)), seed=sampling.get("seed"),
                            stop=tuple(sampling.get("stop") or ()))

    def make_agent() -> Any:
        hf = make_engine(policy, backend="hf", max_batch_size=int(engine.get("max_batch_size", 64)),
                         precision=str(engine.get("precision", "auto")), continuous=bool(engine.get("continuous", True)))
        return PolicyAgent(policy, hf, params)

    return LoadablePolicy(policy, make_agent)


def self_reported(reason: str) -> dict[str, Any]:
    return {"tier": SELF_REPORTED, **{f: SELF_REPORTED for f in EVIDENCE_FIELDS}, "reason": reason}


def entry_evidence(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry's evidence; entries from before tiers existed reproduced nothing, so they are self-reported."""
    got = entry.get("evidence")
    return dict(got) if isinstance(got, Mapping) else self_reported("submitted before reproduction existed")


def evidence_text(entry: Mapping[str, Any]) -> str:
    """``model, responses, tokens`` each as reproduced / self-reported, for the page and ``show``."""
    ev = entry_evidence(entry)
    parts = []
    for f in EVIDENCE_FIELDS:
        status = ev.get(f, SELF_REPORTED)
        if f == "responses" and status == REPRODUCED and isinstance(ev.get("sample"), Mapping):
            status += f" ({ev['sample']['records']} of {ev['sample']['of']})"
        parts.append(f"{f}: {status}")
    return "; ".join(parts)


def sample_positions(n_records: int, size: int, results_sha256: str) -> list[int]:
    """Which records to decode again: ``size`` distinct positions from an RNG seeded by the file's digest."""
    rng = np.random.default_rng(int(results_sha256[:16], 16))
    return sorted(int(i) for i in rng.choice(n_records, size=min(size, n_records), replace=False))


def _turns(record: Mapping[str, Any]) -> list[str]:
    """What the model wrote in a record: every turn of a multi-turn episode, else the one response."""
    return list(record.get("turns") or [record["response"]])


def _recount(tokenizer: Any, texts: list[str]) -> int:
    return sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)


def check_reproduced(doc: Mapping[str, Any], loadable: LoadablePolicy, results_sha256: str, *,
                     sample_size: int = DEFAULT_SAMPLE) -> tuple[dict[str, Any], list[str]]:
    """Check model, responses and token counts of a re-verified results document against ``loadable``.

    Returns ``(evidence, problems)``: evidence says ``reproduced`` for every field when ``problems`` is empty; the
    caller rejects the submission otherwise (a claim a loadable policy contradicts is false, not unknown)."""
    import gymnasium as gym

    import rlvr_envs  # noqa: F401  (registers the IDs)
    from rlvr_envs.harness.evaluate import EnvPool, run_episodes

    agent_desc = doc["provenance"].get("agent") or {}
    cfg, records = doc["config"], doc["records"]
    policy = loadable.policy
    if policy.weights_hash != agent_desc.get("weights_hash"):
        return {}, [f"model {agent_desc.get('model')!r}: its weights hash here is {policy.weights_hash}, the file "
                    f"claims {agent_desc.get('weights_hash')}; the results are not that model's"]
    problems: list[str] = []
    # tokens, every record: the tokenizer's recount of every turn the model wrote, and the sampling cap
    max_new_tokens = int((agent_desc.get("sampling") or {}).get("max_new_tokens", 0)) or None
    for rec in records:
        if rec.get("tokens") is None:
            continue
        turns = _turns(rec)
        recount = _recount(policy.tokenizer, turns)
        cap = None if max_new_tokens is None else max_new_tokens * len(turns)
        if int(rec["tokens"]) < recount - token_slack(recount) or (cap is not None and int(rec["tokens"]) > cap):
            problems.append(f"task {rec['task_id']!r} sample {rec['sample_index']}: claims {rec['tokens']} response "
                            f"tokens, the tokenizer counts {recount} in its text"
                            + (f" (at most {cap} can be generated)" if cap is not None else ""))
    # responses, a seeded sample: decoded again with each sample's seed
    positions = sample_positions(len(records), sample_size, results_sha256)
    chosen = [records[i] for i in positions]
    units = [(int(r["task_index"]), int(r["sample_index"])) for r in chosen]
    def make_env() -> Any:
        return gym.make(cfg["env_id"], **cfg["env_kwargs"])

    pool = EnvPool(make_env(), make_env, owns_first=True)
    try:
        episodes = run_episodes(loadable.make_agent(), pool, units, run_seed=int(cfg["seed"]),
                                n_samples=int(cfg["n_samples"]))
    finally:
        pool.close()
    for rec, ep in zip(chosen, episodes):
        where = f"task {rec['task_id']!r} sample {rec['sample_index']}"
        if ep.turns != _turns(rec):
            problems.append(f"{where}: the recorded response is not what {agent_desc.get('model')} decodes with this "
                            f"sample's seed ({ep.turns[-1][:60]!r} vs {rec['response'][:60]!r})")
        elif rec.get("tokens") is not None and ep.tokens != rec["tokens"]:
            problems.append(f"{where}: claims {rec['tokens']} response tokens, decoding it again took {ep.tokens}")
    evidence = {"tier": REPRODUCED, **{f: REPRODUCED for f in EVIDENCE_FIELDS},
                "sample": {"records": len(chosen), "of": len(records), "positions": positions}}
    if all(rec.get("tokens") is None for rec in records):
        evidence["tokens"] = "not reported"
    return evidence, problems
