"""ml_collections config files: each defines get_config(arg=None)."""
