"""Adapters that let other RL libraries use the rlvr environments."""
