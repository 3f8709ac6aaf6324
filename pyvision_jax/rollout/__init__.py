"""Rollout engines, the trajectory queue, rollout workers and weight publishing."""
