"""Reductions."""
