"""rlvr/HotpotQA-v0 and rlvr/MultiHopSynth-v0: oracle and wrong agents, reward independence from the prompt,
retrieved-text spans, caps, check_env and determinism (BM25 indexes only; dense lives in benchmarks/)."""

import json
import os

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlvr_envs  # noqa: F401
from rlvr_envs.data import DataNotFoundError
from rlvr_envs.search import OracleAgent, run_episode, run_episodes
from rlvr_envs.search.env import SEP
from rlvr_envs.search.hotpotqa import load_hotpotqa
from rlvr_envs.search.hotpotqa import make_env as make_hotpot
from rlvr_envs.search.synth import RELATIONS, MultiHopSource, build_kb, synth_corpus
from rlvr_envs.search.synth import make_env as make_synth

needs_data = pytest.mark.skipif(not os.environ.get("RLVR_DATA_DIR"), reason="needs RLVR_DATA_DIR (multihop/)")


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("RLVR_CACHE_DIR", str(tmp_path_factory.mktemp("search_cache")))
    yield
    mp.undo()


def play_all(env, agent, n=None):
    u = env.unwrapped
    out = []
    for i in range(n or len(u.source)):
        out.append(run_episode(env, agent, options={"index": i}))
    return out


def check_spans(info):
    traj, spans = info["trajectory"], info["retrieved_spans"]
    for s, e in spans:
        assert traj[s:e].startswith("<information>") and traj[s:e].endswith("</information>")
    # Outside the spans there is only the model's own text (and the separators).
    model_text, pos = [], 0
    for s, e in spans:
        model_text.append(traj[pos:s])
        pos = e
    model_text.append(traj[pos:])
    turns = [m["content"] for m in info["messages"] if m["role"] == "assistant"]
    assert "".join(model_text).replace(SEP, "") == "".join(turns)


# -- HotpotQA ---------------------------------------------------------------------------------------------------
@needs_data
def test_hotpotqa_oracle_scores_one_on_every_question_and_wrong_scores_zero():
    env = gym.make("rlvr/HotpotQA-v0")
    u = env.unwrapped
    assert len(u.source) == 100 and len(u.corpus) == 1000
    results = play_all(env, OracleAgent(u))
    assert all(r == 1.0 for r, _ in results)
    assert all(i["correct"] and i["format_ok"] and not i["error"] for _, i in results)
    # Searching the gold titles finds (nearly) every supporting paragraph with BM25 top-3.
    recall = sum(i["gold_recall"] for _, i in results) / len(results)
    assert recall >= 0.95
    for _, info in results[:10]:
        check_spans(info)
    wrong = play_all(env, OracleAgent(u, wrong=True))
    assert all(r == 0.0 and not i["correct"] for r, i in wrong)


@needs_data
def test_reward_ignores_the_prompt_template():
    plain = make_hotpot()
    # A template that carries an example answer (Search-R1's failure mode) and a system prompt.
    fancy = make_hotpot(prompt_template="Example: <answer> Beijing </answer>\nQ: {question}\nA:",
                        system_prompt="You are a search agent. <answer>Paris</answer>")
    for i in range(0, 100, 7):
        a = run_episode(plain, OracleAgent(plain), options={"index": i})[0]
        b = run_episode(fancy, OracleAgent(fancy), options={"index": i})[0]
        assert a == b == 1.0
    obs, info = fancy.reset(options={"index": 0})
    assert "<answer> Beijing </answer>" in obs and info["messages"][0]["role"] == "system"
    for action in ("<search>x</search>", "<answer>Beijing</answer>", "I do not know"):
        obs, r, term, trunc, info = fancy.step(action)
        if term or trunc:
            break
    assert r == 0.0 and not info["correct"]
    task = fancy.source.task(0)
    assert fancy.score(task, "no answer tag " + task.answer).reward == 0.0
    assert fancy.score(task, fancy.gold_response(task)).reward == 1.0


@needs_data
def test_f1_reward_gives_partial_credit():
    env = make_hotpot(reward="f1")
    source = env.source
    i = next(n for n in range(len(source)) if len(source.task(n).answer.split()) >= 2)
    task = source.task(i)
    env.reset(options={"task_id": task.id})
    _, r, term, _, info = env.step(f"<answer>{task.answer.split()[0]} zzz</answer>")
    assert term and 0.0 < r < 1.0 and not info["correct"]


@needs_data
def test_user_corpus_and_questions_via_kwargs(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "title": "Zorblat", "text": "Zorblat is a moon of the planet Quaxl."},
        {"id": "b", "title": "Quaxl", "text": "Quaxl orbits the star Emberon."}]))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "Which star does the planet of Zorblat orbit?",
                                     "answer": "Emberon", "gold_titles": ["Zorblat", "Quaxl"]}))
    env = make_hotpot(questions_path=questions, corpus_path=corpus)
    reward, info = run_episode(env, OracleAgent(env), options={"task_id": "q1"})
    assert reward == 1.0 and info["gold_recall"] == 1.0
    questions.write_text(json.dumps({"question": "q", "answer": "a", "gold_titles": ["Nope"]}))
    with pytest.raises(ValueError, match="not in the corpus"):
        make_hotpot(questions_path=questions, corpus_path=corpus)
    with pytest.raises(DataNotFoundError):
        make_hotpot(data_dir=tmp_path / "empty")


@needs_data
def test_hotpotqa_fingerprint_covers_the_corpus():
    source, corpus = load_hotpotqa()
    assert corpus.content_hash in {corpus.content_hash} and len(source.fingerprint) == 64
    import hashlib
    assert source.fingerprint != hashlib.sha256(b"hotpotqa").hexdigest()


# -- protocol: caps, invalid turns, tool calls ------------------------------------------------------------------
def test_caps_invalid_turns_and_tool_calls():
    env = make_synth(corpus_size=200, num_tasks=20, max_turns=4, max_searches=1)
    task = env.source.task(3)
    obs, info = env.reset(options={"task_id": task.id})
    assert info["turn"] == 0 and info["trajectory"] == "" and info["tools"][0]["function"]["name"] == "search"
    call = json.dumps({"name": "search", "arguments": {"query": task.metadata["gold_titles"][0]}})
    obs, r, term, trunc, info = env.step(f"<tool_call>{call}</tool_call> trailing text is dropped")
    assert not (term or trunc) and info["action"] == "search" and info["searches"] == 1
    assert info["retrieved"][0]["title"] == task.metadata["gold_titles"][0]
    assert "trailing" not in info["messages"][-2]["content"]
    obs, r, term, trunc, info = env.step("<search>anything")  # cut at the stop string: closed in the record
    assert info["messages"][-2]["content"] == "<search>anything</search>"
    assert "Search limit reached" in obs and info["searches"] == 1 and info["retrieved"] == []
    obs, r, term, trunc, info = env.step("hmm, let me think")
    assert "Invalid action" in obs and not (term or trunc)
    check_spans(info)
    assert len(info["retrieved_spans"]) == 3
    obs, r, term, trunc, info = env.step("<search>still searching</search>")  # 4th turn: the cap
    assert trunc and not term and r == 0.0 and not info["correct"] and "turn limit" in info["error"]
    with pytest.raises(gym.error.ResetNeeded):
        env.step("<answer>x</answer>")
    env.reset(options={"index": 0})
    with pytest.raises(TypeError):
        env.step(123)
    short = make_synth(corpus_size=200, num_tasks=20, max_response_chars=40)
    gold = short.source.task(1).answer
    short.reset(options={"index": 1})
    _, r, term, _, info = short.step(f"<answer>{gold}</answer>" + "y" * 100)
    assert term and r == 1.0 and info["truncated_response"] and info["action"] == "answer"
    with pytest.raises(ValueError):
        env.reset(options={"index": 0, "task_id": "x"})
    with pytest.raises(KeyError):
        env.reset(options={"task_id": "mhs-s0-n200-h2-999"})


# -- MultiHopSynth ----------------------------------------------------------------------------------------------
def test_synth_oracle_scores_one_on_every_question_and_each_hop_is_retrievable():
    env = gym.make("rlvr/MultiHopSynth-v0")
    u = env.unwrapped
    assert len(u.source) == 1000 and len(u.corpus) == 1000
    results = play_all(env, OracleAgent(u))
    assert all(r == 1.0 and i["correct"] for r, i in results)
    # Oracle query (the entity's name) ranks each hop's gold document first.
    hops = [u.source.task(i).metadata["gold_titles"] for i in range(len(u.source))]
    queries = [t for titles in hops for t in titles]
    hits = u.retriever.search_many(queries, 1)
    assert [u.corpus[h[0].index].title for h in hits] == queries
    assert all(i["gold_recall"] == 1.0 for _, i in results)
    wrong = play_all(env, OracleAgent(u, wrong=True), n=100)
    assert all(r == 0.0 for r, _ in wrong)


def test_synth_questions_follow_the_knowledge_base():
    kb, corpus = synth_corpus(500, 7)
    source = MultiHopSource(kb, corpus, hops=3, seed=7, num_tasks=50)
    for i in range(50):
        task = source.task(i)
        ents, rels = source.chain(i)
        assert len(ents) == 4 == len(set(ents)) and len(task.metadata["gold_titles"]) == 3
        for a, r, b in zip(ents, rels, ents[1:]):
            assert kb.types[a] == RELATIONS[r][0] and kb.types[b] == RELATIONS[r][1]
            assert kb.rel[r][a] == b
            assert corpus[b].title in corpus[a].text  # the hop's fact is in the gold document
        assert task.answer == corpus[ents[-1]].title and task.answer not in task.question
        assert task.question.startswith("What is the name of ") and corpus[ents[0]].title in task.question
        assert source.index_of(task.id) == i
    assert source.task(5) == source.task(5)


def test_synth_generation_is_seeded_unique_and_scales():
    a, b, c = build_kb(2000, 0), build_kb(2000, 0), build_kb(2000, 1)
    assert a.names == b.names and a.names != c.names
    assert synth_corpus(300, 0)[1].content_hash != synth_corpus(300, 1)[1].content_hash
    big = build_kb(100_000, 3)
    assert len(set(big.names)) == 100_000  # every name distinct, across types too
    with pytest.raises(ValueError):
        build_kb(5)
    env = make_synth(corpus_size=300, hops=4, num_tasks=10)
    assert env.max_turns == 6 and env.max_searches == 5
    r, info = run_episode(env, OracleAgent(env), options={"index": 9})
    assert r == 1.0 and info["searches"] == 4 and info["gold_recall"] == 1.0
    with pytest.raises(ValueError):
        make_synth(corpus_size=300, hops=0)


def test_batched_multi_turn_play_mixes_episode_lengths():
    envs = [make_synth(corpus_size=300, hops=h, num_tasks=10) for h in (1, 2, 3, 2)]
    oracles = {env.source.hops: OracleAgent(env) for env in envs}

    class BatchedOracle:  # one act() per turn over the episodes still running, like a batched policy
        calls: list[int] = []

        def act(self, observations, infos):
            self.calls.append(len(infos))
            return [oracles[int(i["task_id"].split("-h")[1].split("-")[0])].act([o], [i])[0]
                    for o, i in zip(observations, infos)]

    agent = BatchedOracle()
    results = run_episodes(envs, agent, [{"index": i} for i in range(4)])
    assert [r for r, _ in results] == [1.0] * 4
    assert [i["searches"] for _, i in results] == [1, 2, 3, 2]
    assert agent.calls == [4, 4, 3, 1]  # finished episodes drop out of the batch
    with pytest.raises(ValueError):
        run_episodes(envs, agent, [{}])


# -- gymnasium conventions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["rlvr/MultiHopSynth-v0", pytest.param("rlvr/HotpotQA-v0", marks=needs_data)])
def test_check_env_and_determinism(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)

    def rollout(seed):
        e = gym.make(env_id)
        obs, info = e.reset(seed=seed)
        trace = [obs, info["task_id"]]
        agent = OracleAgent(e.unwrapped)
        done = False
        while not done:
            (a,) = agent.act([obs], [info])
            obs, r, term, trunc, info = e.step(a)
            trace += [obs, r, info["trajectory"], info["retrieved_spans"]]
            done = term or trunc
        return trace

    assert rollout(11) == rollout(11)
    assert rollout(11)[1] != rollout(12)[1] or rollout(11)[1] != rollout(13)[1]
