"""rlvr-envs: Gymnasium environments for RL from verifiable rewards.

``import rlvr_envs`` registers every ``rlvr/...`` ID, so ``gymnasium.make("rlvr/MATH-v0")`` works.
"""

from rlvr_envs.core import ListSource, Task, TaskSource, TextEnv, Verdict
from rlvr_envs.registration import register_all
from rlvr_envs.spaces import TextSpace, make_vec

__version__ = "0.1.0"
__all__ = ["ListSource", "Task", "TaskSource", "TextEnv", "TextSpace", "Verdict", "make_vec", "__version__"]

register_all()
