"""Rollout: the KV-cache sampler and the interface RL generates through."""
