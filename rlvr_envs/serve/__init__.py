"""``rlvr serve``: any registered text env over the network with the OpenEnv wire protocol.

Needs the ``[serve]`` extra (openenv-core, fastapi, uvicorn, websockets); importing this package without it raises
``MissingExtraError`` naming the extra. See docs/serving.md.
"""

from rlvr_envs.extras import require_extra

require_extra("serve", "rlvr serve")

from rlvr_envs.serve.app import RlvrEnvServer, create_app, running_server  # noqa: E402
from rlvr_envs.serve.environment import ServedEnvs, ServeError, SessionEnv  # noqa: E402
from rlvr_envs.serve.models import TextAction, TextEnvState, TextObservation  # noqa: E402

__all__ = ["RlvrEnvServer", "ServeError", "ServedEnvs", "SessionEnv", "TextAction", "TextEnvState",
           "TextObservation", "create_app", "running_server"]
