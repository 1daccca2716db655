"""The verifiers (>= 0.4) taskset id of rlvr-envs: ``--env.taskset.id rlvr-envs-verifiers``.

verifiers resolves a taskset id to a top-level module (``rlvr-envs-verifiers`` -> ``rlvr_envs_verifiers``) that exports
one ``Taskset`` subclass in ``__all__``; the taskset lives in ``rlvr_envs.integrations.verifiers_env``.
"""

from rlvr_envs.integrations.verifiers_env import RlvrTaskset

__all__ = ["RlvrTaskset"]
