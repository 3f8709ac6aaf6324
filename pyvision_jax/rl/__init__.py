"""The PyVision-RL math: answer scoring, rewards, group selection, advantages, losses."""
