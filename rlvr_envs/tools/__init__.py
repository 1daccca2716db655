"""Tool-use environments: ``rlvr/ToolUse-v0`` (stateful SQLite sandbox, env.py) and ``rlvr/BFCL-v0`` (bfcl.py).

Submodules are imported by their entry points only, so ``import rlvr_envs`` stays fast (no sqlite/jsonschema load).
"""
