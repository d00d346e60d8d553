"""Helpers for tests and demos that need a model but not a good one."""
