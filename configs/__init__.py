"""Config files (big_vision style: each has get_config(); override with --config.x=y)."""
