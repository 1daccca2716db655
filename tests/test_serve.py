"""``rlvr serve`` and ``RemoteEnv`` against a real uvicorn server on 127.0.0.1 (a free port, a background thread).

OpenEnv's own ``GenericEnvClient`` plays a single-turn, a tool-use and a search family with oracle answers (reward 1)
and wrong ones (reward 0); bad input gets an error that says what to send; the session cap, the per-step time limit
and the idle timeout hold; sessions are isolated; ``RemoteEnv`` matches the in-process env; a bounded load test with
dropped connections leaks no session. Loopback only.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import gymnasium as gym
import pytest

pytest.importorskip("openenv")
pytest.importorskip("uvicorn")

import rlvr_envs  # noqa: E402,F401
from rlvr_envs.core import ListSource, Task, TextEnv, Verdict, WallTime  # noqa: E402
from rlvr_envs.extras import MissingExtraError  # noqa: E402
from rlvr_envs.remote import REMOTE_ID, RemoteEnv, RemoteEnvError  # noqa: E402
from rlvr_envs.serve import create_app, running_server  # noqa: E402

GenericEnvClient = pytest.importorskip("openenv.core").GenericEnvClient

SINGLE, TOOL, SEARCH = "rlvr/Countdown-v0", "rlvr/ToolUse-v0", "rlvr/MultiHopSynth-v0"
ARITH = "rlvr/Arithmetic-v0"
SERVED = [ARITH, SINGLE, TOOL, SEARCH]


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("RLVR_CACHE_DIR", str(tmp_path_factory.mktemp("serve_cache")))  # the search env's index cache
    yield
    mp.undo()


@pytest.fixture(scope="module")
def app(_cache_dir):
    pytest.importorskip("bm25s")  # the search env
    return create_app(SERVED, max_sessions=80, step_timeout_s=30, idle_timeout_s=60)


@pytest.fixture(scope="module")
def url(app):
    with running_server(app) as base:
        yield base


@pytest.fixture(scope="module")
def local():
    """In-process envs: the source of oracle answers, and the reference RemoteEnv must match."""
    return {env_id: gym.make(env_id).unwrapped for env_id in SERVED}


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post_json(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def oracle(local_env, *, wrong: bool = False):
    """The next turn given the observation and info: the env's own oracle (or a wrong final answer)."""
    from rlvr_envs.search import OracleAgent as SearchOracle
    from rlvr_envs.tools.env import OracleAgent as ToolOracle

    if hasattr(local_env, "oracle_actions"):  # search
        agent = SearchOracle(local_env, wrong=wrong)
        return lambda obs, info: agent.act([obs], [info])[0]
    if hasattr(local_env, "gold_turns"):  # tool use: wrong = answer at once, no tool calls
        agent = ToolOracle(local_env)
        return (lambda obs, info: "<answer>definitely not it</answer>") if wrong else (
            lambda obs, info: agent.act([obs], [info])[0])

    def single(obs, info):
        task = local_env.source.task(local_env.source.index_of(info["task_id"]))
        if wrong:  # the gold response of another task whose answer differs
            other = next(t for i in range(1, 50) if (t := local_env.source.task(info["index"] + i)).answer != task.answer)
            return local_env.gold_response(other)
        return local_env.gold_response(task)
    return single


def play_openenv(client, env_id: str, index: int, policy) -> tuple[float, int]:
    result = client.reset(env_id=env_id, index=index)
    turns = 0
    while not result.done:
        info = {**result.observation["info"], "messages": result.observation["messages"]}
        result = client.step({"text": policy(result.observation["prompt"], info)})
        turns += 1
    return result.reward, turns


# -- OpenEnv's client plays three families -------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", [SINGLE, TOOL, SEARCH])
def test_openenv_generic_client_gold_scores_one_and_wrong_zero(url, local, env_id):
    with GenericEnvClient(base_url=url).sync() as client:
        for index in (0, 3):
            reward, turns = play_openenv(client, env_id, index, oracle(local[env_id]))
            assert reward == 1.0, (env_id, index)
            if env_id != SINGLE:
                assert turns >= 2  # a real multi-turn episode: tool calls or searches before the answer
            assert play_openenv(client, env_id, index, oracle(local[env_id], wrong=True))[0] == 0.0
        state = client.state()
        assert state["env_id"] == env_id and state["episode_open"] is False and state["step_count"] >= 1


def test_observation_carries_prompt_messages_and_info(url, local):
    with GenericEnvClient(base_url=url).sync() as client:
        result = client.reset(env_id=TOOL, seed=7)
        obs = result.observation
        reference_obs, reference_info = gym.make(TOOL).reset(seed=7)
        assert obs["prompt"] == reference_obs and obs["messages"] == reference_info["messages"]
        assert obs["info"]["task_id"] == reference_info["task_id"] and obs["info"]["tools"] == reference_info["tools"]
        assert result.reward is None and result.done is False and obs["env_id"] == TOOL
        # the default env is the first served one
        assert client.reset(seed=7).observation["env_id"] == ARITH


# -- HTTP routes ------------------------------------------------------------------------------------------------------
def test_http_routes(url, local):
    assert get_json(url + "/health")["status"] == "healthy"
    schema = get_json(url + "/schema")
    assert "text" in schema["action"]["properties"] and "text" in schema["action"]["required"]
    assert {"prompt", "messages", "info", "terminated", "truncated"} <= set(schema["observation"]["properties"])
    envs = get_json(url + "/envs")
    assert envs["default"] == ARITH and list(envs["envs"]) == SERVED
    assert envs["envs"][TOOL]["action_space"] == {"type": "text", "max_length": local[TOOL].action_space.max_length,
                                                  "min_length": 0}
    status, body = post_json(url + "/reset", {"env_id": SINGLE, "index": 5})
    assert status == 200 and body["observation"]["info"]["index"] == 5 and body["done"] is False
    # stateless HTTP step: reset arguments in the same request play a one-step episode
    gold = local[SINGLE].gold_response(local[SINGLE].source.task(5))
    status, body = post_json(url + "/step", {"action": {"text": gold}, "env_id": SINGLE, "index": 5})
    assert status == 200 and body["reward"] == 1.0 and body["done"] is True
    status, body = post_json(url + "/step", {"action": {"text": gold}})
    assert status == 400 and "step before reset" in body["detail"]
    status, body = post_json(url + "/reset", {"env_id": "rlvr/Nope-v0"})
    assert status == 400 and "unknown env id 'rlvr/Nope-v0'" in body["detail"] and ARITH in body["detail"]
    status, body = post_json(url + "/step", {"action": {"txt": "x"}})
    assert status == 422
    metrics = get_json(url + "/metrics")
    assert {"sessions_open", "max_sessions", "steps_total", "steps_per_s", "step_ms", "verify_ms"} <= set(metrics)
    assert metrics["max_sessions"] == 80 and metrics["steps_total"] >= 1 and metrics["verify_ms"]["n"] >= 1
    assert metrics["verify_ms"]["p50"] <= metrics["verify_ms"]["p99"]


# -- errors ---------------------------------------------------------------------------------------------------------
def test_bad_input_gets_a_clear_error_and_the_session_survives(url, local):
    with GenericEnvClient(base_url=url).sync() as client:
        def error(call, *args, **kwargs) -> str:
            with pytest.raises(RuntimeError) as info:
                call(*args, **kwargs)
            return str(info.value)

        assert "step before reset" in error(client.step, {"text": "1"})
        assert "unknown env id 'rlvr/Nope-v0'" in error(client.reset, env_id="rlvr/Nope-v0")
        assert "unknown reset argument(s) 'colour'" in error(client.reset, colour="red")
        assert "index -1 out of range" in error(client.reset, env_id=TOOL, index=-1)
        assert "unknown task id 'nope'" in error(client.reset, env_id=TOOL, task_id="nope")
        assert "index must be an integer" in error(client.reset, index="three")
        assert "env_kwargs must be a JSON object" in error(client.reset, env_kwargs=[1])
        assert "gym.make('rlvr/Countdown-v0'" in error(client.reset, env_id=SINGLE, env_kwargs={"bogus": 1})
        client.reset(env_id=ARITH, index=2)
        assert "missing 'text'" in error(client.step, {})
        assert "'text' must be a string, got int" in error(client.step, {"text": 5})
        assert "unknown field 'foo'" in error(client.step, {"text": "x", "foo": 1})
        # the episode is still open after those: the real answer scores
        answer = local[ARITH].source.task(2).answer
        assert client.step({"text": f"\\boxed{{{answer}}}"}).reward == 1.0
        assert "no open episode" in error(client.step, {"text": "again"})  # a finished episode needs a reset


def test_raw_socket_errors(url):
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws") + "/ws") as ws:
        def ask(raw: str) -> dict:
            ws.send(raw)
            return json.loads(ws.recv(timeout=10))

        assert ask("not json")["data"]["code"] == "INVALID_JSON"
        assert ask("[1]")["data"]["code"] == "INVALID_JSON"
        reply = ask(json.dumps({"type": "jump"}))
        assert reply["data"]["code"] == "UNKNOWN_TYPE" and "send reset, step, state or close" in reply["data"]["message"]
        reply = ask(json.dumps({"type": "step", "data": "text"}))
        assert reply["data"]["code"] == "VALIDATION_ERROR" and "must be a JSON object" in reply["data"]["message"]
        assert ask(json.dumps({"type": "reset", "data": {"index": 1}}))["type"] == "observation"


# -- sessions -------------------------------------------------------------------------------------------------------
def test_sessions_are_isolated(url, local):
    """Two sessions on one multi-turn env, turns interleaved: each keeps its own sandbox and chat."""
    a, b = GenericEnvClient(base_url=url).sync(), GenericEnvClient(base_url=url).sync()
    with a, b:
        ra, rb = a.reset(env_id=TOOL, index=1), b.reset(env_id=TOOL, index=2)
        assert ra.observation["info"]["task_id"] != rb.observation["info"]["task_id"]
        policy = oracle(local[TOOL])
        turns = 0
        while not (ra.done and rb.done):
            for client, result in ((a, ra), (b, rb)):
                if not result.done:
                    info = {**result.observation["info"], "messages": result.observation["messages"]}
                    new = client.step({"text": policy(result.observation["prompt"], info)})
                    ra, rb = (new, rb) if client is a else (ra, new)
            turns += 1
            assert turns < 20
        assert ra.reward == 1.0 and rb.reward == 1.0
        assert a.state()["task_id"] == ra.observation["info"]["task_id"] != b.state()["task_id"]


def test_max_sessions_cap_refuses_with_a_clear_error_and_frees_slots():
    app = create_app(ARITH, max_sessions=2)
    with running_server(app) as base:
        first, second = GenericEnvClient(base_url=base).sync(), GenericEnvClient(base_url=base).sync()
        first.reset(index=0)
        second.reset(index=1)
        third = GenericEnvClient(base_url=base).sync()
        # as the error message, or as the close reason when the client's send races the server's close
        with pytest.raises(Exception, match=r"server at capacity: 2 of 2 sessions open \(--max-sessions 2\)"):
            third.reset(index=2)
        third.close()
        first.close()
        assert wait_until(lambda: app.state.rlvr.active_sessions == 1)
        with GenericEnvClient(base_url=base).sync() as fourth:
            assert fourth.reset(index=3).observation["info"]["index"] == 3
        second.close()
        assert wait_until(lambda: app.state.rlvr.active_sessions == 0)
        metrics = get_json(base + "/metrics")
        assert metrics["sessions_rejected_total"] == 1 and metrics["sessions_opened_total"] == 3


def _slow_env() -> TextEnv:
    def scorer(task: Task, response: str) -> Verdict:
        if response == "slow":
            time.sleep(1.5)
        return Verdict(correct=response == task.answer, reward=float(response == task.answer))
    return TextEnv(ListSource([Task("t0", "say 1", "1")], "slow"), scorer)


def test_step_time_limit_and_idle_timeout_close_the_session():
    if "rlvr_test/Slow-v0" not in gym.registry:
        gym.register("rlvr_test/Slow-v0", entry_point=_slow_env)
    app = create_app("rlvr_test/Slow-v0", max_sessions=4, step_timeout_s=0.3, idle_timeout_s=1.0)
    with running_server(app) as base:
        with GenericEnvClient(base_url=base).sync() as client:
            client.reset()
            assert client.step({"text": "1"}).reward == 1.0
            client.reset()
            with pytest.raises(RuntimeError, match=r"step took longer than the server's limit of 0.3 s"):
                client.step({"text": "slow"})
            with pytest.raises(Exception):  # noqa: B017  the server closed this session
                client.reset()
        assert wait_until(lambda: app.state.rlvr.active_sessions == 0)
        with GenericEnvClient(base_url=base).sync() as client:
            client.reset()
            time.sleep(1.4)
            # the server's close reason reaches a client that sends before reading
            with pytest.raises(Exception, match=r"session closed after 1 s without a message \(--idle-timeout\)"):
                client.step({"text": "1"})
        assert wait_until(lambda: app.state.rlvr.active_sessions == 0)
        metrics = get_json(base + "/metrics")
        assert metrics["step_timeouts_total"] == 1 and metrics["idle_closed_total"] == 1


# -- RemoteEnv ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", [SINGLE, TOOL])
def test_remote_env_equals_the_in_process_env(url, local, env_id):
    remote, reference = RemoteEnv(url, env_id), gym.make(env_id)
    try:
        assert remote.observation_space == reference.observation_space
        assert remote.action_space == reference.action_space
        policy = oracle(local[env_id])
        for seed in (0, 11):
            (obs_r, info_r), (obs_l, info_l) = remote.reset(seed=seed), reference.reset(seed=seed)
            assert obs_r == obs_l and info_r == json.loads(json.dumps(info_l))
            done = False
            while not done:
                action = policy(obs_l, info_l)
                step_r, step_l = remote.step(action), reference.step(action)
                assert step_r[:4] == step_l[:4]
                # timing is measurement: the remote one is a WallTime too, so it compares equal to any other
                assert isinstance(step_r[4].pop("verify_ms", WallTime(0)), WallTime)
                info_l = json.loads(json.dumps({k: v for k, v in step_l[4].items() if k != "verify_ms"}))
                assert step_r[4] == info_l
                obs_l, done = step_l[0], step_l[2] or step_l[3]
            assert step_r[1] == 1.0
        # seed=None continues the session's generator exactly as in-process
        assert remote.reset()[0] == reference.reset()[0]
    finally:
        remote.close()


def test_remote_env_passes_check_env_and_works_in_wrappers_and_vector_envs(url):
    from gymnasium.utils.env_checker import check_env

    env = RemoteEnv(url, SINGLE)
    check_env(env, skip_render_check=True)
    env.close()
    wrapped = gym.wrappers.RecordEpisodeStatistics(gym.wrappers.TimeLimit(RemoteEnv(url, ARITH), 1))
    wrapped.reset(seed=0)
    *_, info = wrapped.step("\\boxed{0}")
    assert info["episode"]["l"] == 1
    wrapped.close()
    vec = gym.make_vec(f"rlvr_envs.remote:{REMOTE_ID}", num_envs=3, url=url, env_id=ARITH)
    obs, _ = vec.reset(seed=0)
    reference = gym.make_vec(ARITH, num_envs=3)
    assert tuple(obs) == tuple(reference.reset(seed=0)[0])
    assert list(vec.step(["1", "2", "3"])[1]) == list(reference.step(["1", "2", "3"])[1])
    vec.close()
    with pytest.raises(RemoteEnvError, match="unknown env id 'rlvr/Nope-v0'"):
        RemoteEnv(url, "rlvr/Nope-v0")
    remote = RemoteEnv(url, ARITH)
    with pytest.raises(RemoteEnvError, match="step before reset") as info:
        remote.step("1")
    assert info.value.code == "VALIDATION_ERROR"
    remote.close()


# -- load and faults ------------------------------------------------------------------------------------------------
def test_load_with_dropped_connections_leaks_nothing(url, app, local):
    """64 concurrent sessions x 4 episodes of gold answers; 8 more drop their connection mid-episode (no close
    frame). Every other session finishes with reward 1; afterwards no session and no session thread is left."""
    from websockets.asyncio.client import connect

    server = app.state.rlvr
    assert wait_until(lambda: server.active_sessions == 0)
    threads_before = threading.active_count()
    ws_url = url.replace("http", "ws") + "/ws"
    answers = {i: local[ARITH].source.task(i).answer for i in range(64 * 4)}

    async def player(n: int) -> list[float]:
        rewards = []
        async with connect(ws_url, open_timeout=20) as ws:
            for e in range(4):
                index = n * 4 + e
                await ws.send(json.dumps({"type": "reset", "data": {"env_id": ARITH, "index": index}}))
                assert json.loads(await ws.recv())["type"] == "observation"
                await ws.send(json.dumps({"type": "step", "data": {"text": f"\\boxed{{{answers[index]}}}"}}))
                rewards.append(json.loads(await ws.recv())["data"]["reward"])
        return rewards

    async def dropper() -> None:
        ws = await connect(ws_url, open_timeout=20)
        await ws.send(json.dumps({"type": "reset", "data": {"env_id": TOOL, "index": 0}}))
        await ws.recv()
        ws.transport.abort()  # mid-episode, no close handshake: as a crashed client

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(player(n) for n in range(64)),
                                                     *(dropper() for _ in range(8))), timeout=60)

    steps_before = get_json(url + "/metrics")["steps_total"]
    results = asyncio.run(main())
    assert [r for r in results if r is not None] == [[1.0] * 4] * 64
    assert wait_until(lambda: server.active_sessions == 0)
    assert get_json(url + "/metrics")["steps_total"] - steps_before == 64 * 4
    assert wait_until(lambda: threading.active_count() <= threads_before)  # session executors shut down


# -- install profile and CLI ------------------------------------------------------------------------------------------
def test_missing_serve_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv", None)
    for name in [m for m in sys.modules if m == "rlvr_envs.serve" or m.startswith("rlvr_envs.serve.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtraError, match=r"rlvr serve needs the \[serve\] extra"):
        importlib.import_module("rlvr_envs.serve")


def test_cli_refuses_unknown_and_non_text_envs(capsys):
    from rlvr_envs.cli import main

    assert main(["serve", "--env", "rlvr/Nope-v0"]) == 2
    assert "unknown env id 'rlvr/Nope-v0'" in capsys.readouterr().err
    assert main(["serve", "--env", "rlvr/Taxi-v0"]) == 2
    assert "serves text envs only" in capsys.readouterr().err
