"""Measurements of Sol's mechanisms (quality, bytes, time): run by hand or
by slow tests, never imported on the daemon's path."""
