"""Decoders (Flax NNX), presets, checkpoint loaders and tokenizers."""
