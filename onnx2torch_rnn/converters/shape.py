"""Tensor and shape manipulation ops."""
