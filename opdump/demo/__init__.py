"""A small built-in model and training loop for the demo and the tests (no download)."""
