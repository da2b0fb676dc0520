"""tunix_pw: a Pathways-first JAX post-training framework."""
