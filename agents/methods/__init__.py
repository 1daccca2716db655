"""Seed-paper methods, one file each; each registers its components into named stages of agents.grpo."""
