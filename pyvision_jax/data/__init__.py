"""Tasks: the row schema and loaders, synthetic task generators, and the one seeded task
order (with its sharding over workers and its seed derivation) that every producer uses."""
