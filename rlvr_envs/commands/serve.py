"""``rlvr serve``: serve registered text envs over the OpenEnv protocol (HTTP + WebSocket sessions)."""

from __future__ import annotations

import argparse
import sys

from rlvr_envs.commands import json_object
from rlvr_envs.extras import require_extra


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve envs over the network (OpenEnv protocol)",
                       description="Serve one or more env IDs with the OpenEnv wire protocol: POST /reset, /step, "
                                   "GET /state, /health, /schema, /metrics, /envs and the /ws session socket. "
                                   "Clients: openenv's GenericEnvClient, rlvr_envs.remote.RemoteEnv. See "
                                   "docs/serving.md.")
    p.add_argument("--env", dest="envs", action="append", default=[], metavar="ENV_ID",
                   help="env ID to serve (repeat for several; the first is the default of a reset naming none)")
    p.add_argument("--policy", default=None, metavar="MODEL",
                   help="serve this policy (tiny, smollm2, a model directory) behind the OpenAI chat-completions API "
                        "(/v1/chat/completions) instead of envs: for harnesses that call a model over HTTP")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "auto"),
                   help="decode precision of --policy (default fp32: the same text on every CPU)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64,
                   help="concurrent WebSocket sessions; one more is refused with CAPACITY_REACHED (default: 64)")
    p.add_argument("--step-timeout", type=float, default=60.0,
                   help="seconds one step may take; past it the client gets an error and its session closes")
    p.add_argument("--reset-timeout", type=float, default=300.0,
                   help="seconds one reset may take (the first reset of a session makes its env)")
    p.add_argument("--idle-timeout", type=float, default=300.0,
                   help="seconds a session may stay silent before the server closes it")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of keyword arguments for gym.make (every env)")
    p.add_argument("--no-client-env-kwargs", action="store_true",
                   help="refuse env_kwargs sent by clients in reset (they could ask for costly envs)")
    p.add_argument("--ws-deflate", action="store_true",
                   help="accept permessage-deflate: smaller frames for long prompts, more CPU per message (off: "
                        "loopback and LAN links gain nothing from it)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_extra("serve", "rlvr serve")
    import uvicorn

    if bool(args.policy) == bool(args.envs):
        print("rlvr serve: give --env ENV_ID (repeatable) to serve envs, or --policy MODEL to serve a policy",
              file=sys.stderr)
        return 2
    if args.policy:
        require_extra("agents", "rlvr serve --policy")
        from agents.policy.engine import make_engine
        from agents.policy.models import load_policy
        from rlvr_envs.serve.policy import create_policy_app

        policy = load_policy(args.policy)
        app = create_policy_app(policy, make_engine(policy, precision=args.precision), model_name=args.policy)
        print(f"rlvr serve: policy {args.policy} on http://{args.host}:{args.port}/v1/chat/completions",
              file=sys.stderr)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        return 0

    from rlvr_envs.serve import ServeError, create_app

    try:
        app = create_app(args.envs, max_sessions=args.max_sessions, step_timeout_s=args.step_timeout,
                         reset_timeout_s=args.reset_timeout, idle_timeout_s=args.idle_timeout,
                         env_kwargs=json_object(args.env_kwargs, "--env-kwargs"),
                         allow_client_env_kwargs=not args.no_client_env_kwargs)
    except (ServeError, ValueError) as exc:
        print(f"rlvr serve: {exc}", file=sys.stderr)
        return 2
    print(f"rlvr serve: {', '.join(args.envs)} on http://{args.host}:{args.port} (ws://{args.host}:{args.port}/ws, "
          f"max {args.max_sessions} sessions)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, ws_per_message_deflate=args.ws_deflate)
    return 0
