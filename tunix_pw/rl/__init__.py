"""RL: registered pure functions (advantages, policy losses, aggregations,
KL estimators, rewards); a new algorithm is registered functions plus a
config."""
