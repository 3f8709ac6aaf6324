"""Overrides that make launch/train.py on tests/tiny_random_cpu.py a seconds-long run: the tiny
random-init model, one task per kind, one group of two, eight new tokens a turn."""

TINY = [
    "--config.model.hf_dir=",
    "--config.model.preset=tiny",
    "--config.rl.group_size=2",
    "--config.rl.batch_groups=1",
    "--config.rl.max_gen_rounds=1",
    "--config.episode.max_new_tokens_per_turn=8",
    "--config.data.synthetic_per_kind=1",
    "--config.sandbox.pool_size=1",
    "--config.train.length_buckets=512",
    "--config.rollout.length_buckets=512,1024",
]
